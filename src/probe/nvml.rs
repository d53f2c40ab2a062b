//! The NVML phase: driver and CUDA driver versions, and per GPU its model, memory, ECC and
//! retired pages, persistence and MIG modes, clocks and throttle reasons, PCIe link, NVLink
//! links, plus the topology and P2P-status matrices between GPUs.

use super::nccl_log::ranges;
use super::policy::{ModelPolicy, for_gpu};
use super::report::Status;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, P2pCapabilitiesIndex, TopologyLevel,
};
use nvml_wrapper::error::NvmlError;

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
    /// How many GPUs NVML counts on the node, opened or not.
    pub count: u32,
    /// The driver version.
    pub driver: String,
    /// The CUDA version the driver supports, `13.0`.
    pub cuda: String,
    /// The GPUs.
    pub gpus: Vec<Gpu>,
    /// `topology[i][j]`: NVML's common-ancestor level between `gpus[i]` and `gpus[j]`.
    pub topology: Vec<Vec<String>>,
    /// `p2p[i][j]`: NVML's P2P read status between `gpus[i]` and `gpus[j]`.
    pub p2p: Vec<Vec<String>>,
    /// Where each GPU sits relative to the CPUs.
    pub affinity: Vec<GpuAffinity>,
}

/// Where one GPU sits relative to the CPUs, as NVML says: what a launcher binds a rank to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuAffinity {
    /// NVML index.
    pub index: u32,
    /// The CPUs NVML calls near the GPU (`0-55,112-167`), empty when its mask was empty;
    /// None when NVML would not say.
    pub cpus: Option<String>,
    /// The GPU's NUMA node; None when NVML would not say.
    pub numa_node: Option<u32>,
    /// Why a value is absent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// A check result before it is placed in the report.
pub type Found = (String, Status, String);

/// The library every NVML user opens; the toolkit injects it from the host's driver.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// glibc's libraries that glibc 2.34 folded into libc.so.6 but still ships as stubs, and
/// that the driver's libraries (built against older glibc) still name as dependencies.
pub const GLIBC_COMPAT_LIBRARIES: &[&str] =
    &["libpthread.so.0", "libdl.so.2", "librt.so.1", "libm.so.6"];

/// Why the NVML phase could not look at any GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// libnvidia-ml.so.1 is nowhere the loader looks: the driver was not injected or installed.
    LibraryNotFound(String),
    /// libnvidia-ml.so.1 is there but does not load: the image lacks something it needs.
    LibraryUnloadable {
        /// The loader's message.
        dlerror: String,
        /// The library it could not find, when the message names one.
        missing: Option<String>,
    },
    /// NVML loaded but the driver did not answer (not loaded, no permission, no GPU).
    Driver(String),
    /// `--devices` named a GPU this node does not have: bad input.
    NoSuchDevice(String),
    /// NVML_ERROR_UNKNOWN from nvmlInit: where GPU nodes exist, the lost device cgroup.
    Unknown(String),
}

impl Failure {
    fn from_init(e: NvmlError) -> Self {
        match e {
            NvmlError::LibloadingError(load) => load_failure(&super::loader::message(&load)),
            // nvidia-smi prints it as "Failed to initialize NVML: Unknown Error".
            NvmlError::Unknown => Failure::Unknown("NVML_ERROR_UNKNOWN (\"Unknown Error\")".into()),
            other => Failure::Driver(format!("NVML did not initialise: {other}")),
        }
    }

    /// What went wrong and what to do about it, for the report.
    pub fn explain(&self) -> String {
        match self {
            Failure::LibraryNotFound(e) | Failure::Driver(e) | Failure::NoSuchDevice(e) => {
                e.clone()
            }
            Failure::Unknown(e) => format!("NVML did not initialise: {e}"),
            Failure::LibraryUnloadable { dlerror, missing } => {
                let mut text = format!("{NVML_LIBRARY} is present but does not load: {dlerror}");
                match missing.as_deref() {
                    Some(lib) if GLIBC_COMPAT_LIBRARIES.contains(&lib) => text.push_str(&format!(
                        ". The image lacks {lib}: the driver's libraries need glibc's compatibility libraries {}, so the base image must carry them (glibc 2.34 and later still ship them as stubs)",
                        GLIBC_COMPAT_LIBRARIES.join(", ")
                    )),
                    Some(lib) => text.push_str(&format!(
                        ". The image lacks {lib}, which {NVML_LIBRARY} needs: add it to the base image"
                    )),
                    None => text.push_str(
                        ". The image cannot load the driver's library: fix the base image (the GPU and driver are not at fault)",
                    ),
                }
                text
            }
        }
    }
}

/// Reads the loader's message for `libnvidia-ml.so.1`. glibc names the file it could not
/// open first (`libpthread.so.0: cannot open shared object file: ...`); musl says
/// `Error loading shared library libpthread.so.0: ... (needed by ...)`. When that file is
/// NVML itself the driver was not injected; any other file, or any other failure (a wrong
/// ELF class, a missing symbol version), is the image's defect.
pub fn load_failure(dlerror: &str) -> Failure {
    match super::loader::unopened(dlerror) {
        Some(lib) if lib == NVML_LIBRARY => {
            Failure::LibraryNotFound(format!("{NVML_LIBRARY} could not be loaded: {dlerror}"))
        }
        missing => Failure::LibraryUnloadable {
            dlerror: dlerror.to_string(),
            missing,
        },
    }
}

/// The GPU indices to probe: all of them, or `wanted` when every index exists. An index
/// past the last GPU is a mistake on the command line, not something to drop quietly.
pub fn select_devices(wanted: Option<&[u32]>, count: u32) -> Result<Vec<u32>, Failure> {
    let Some(wanted) = wanted else {
        return Ok((0..count).collect());
    };
    if wanted.is_empty() {
        return Err(Failure::NoSuchDevice(
            "--devices names no GPU index".to_string(),
        ));
    }
    let missing: Vec<String> = wanted
        .iter()
        .filter(|i| **i >= count)
        .map(u32::to_string)
        .collect();
    if !missing.is_empty() {
        let exist = match count {
            0 => "NVML sees no GPU".to_string(),
            1 => "NVML sees 1 GPU, index 0".to_string(),
            n => format!("NVML sees {n} GPUs, indices 0 to {}", n - 1),
        };
        return Err(Failure::NoSuchDevice(format!(
            "--devices: no GPU with index {}: {exist}",
            missing.join(", ")
        )));
    }
    let mut out: Vec<u32> = Vec::new();
    for i in wanted {
        if !out.contains(i) {
            out.push(*i);
        }
    }
    Ok(out)
}

/// The NVML indices of the GPUs `CUDA_VISIBLE_DEVICES` shows, in CUDA's order; None when it
/// is unset. NVML ignores the variable, but CUDA (the probe's worker, NCCL) cannot open a GPU
/// it hides, and launchers that bind GPUs to tasks (Slurm's `--gpus-per-task`, one torchrun
/// agent per GPU) set it: a GPU it hides is not this process's to probe. Entries are indices
/// (NVML numbers GPUs in PCI order, as CUDA does under `CUDA_DEVICE_ORDER=PCI_BUS_ID` and on
/// nodes of one GPU model) or `GPU-` UUIDs, whole or a prefix; as in CUDA, reading stops at
/// the first entry that is neither, and an index past the last GPU is skipped.
pub fn cuda_visible(spec: Option<&str>, gpus: &[(u32, String)]) -> Option<Vec<u32>> {
    let spec = spec?;
    let mut visible = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = match entry.parse::<u32>() {
            Ok(index) => gpus.iter().find(|g| g.0 == index),
            Err(_) if entry.starts_with("GPU-") => gpus
                .iter()
                .find(|g| !g.1.is_empty() && g.1.starts_with(entry)),
            Err(_) => break,
        };
        if let Some(g) = found.filter(|g| !visible.contains(&g.0)) {
            visible.push(g.0);
        }
    }
    Some(visible)
}

/// Opens each GPU in `indices`. One that does not open (a GPU fallen off the bus, an
/// Xid-wedged board) fails its own check and the others are still probed.
pub fn open_each<D, E: std::fmt::Display>(
    indices: &[u32],
    mut open: impl FnMut(u32) -> Result<D, E>,
) -> (Vec<(u32, D)>, Vec<Found>) {
    let mut opened = Vec::new();
    let mut checks = Vec::new();
    for &i in indices {
        match open(i) {
            Ok(d) => opened.push((i, d)),
            Err(e) => checks.push((
                format!("GPU {i}"),
                Status::Fail,
                format!("NVML cannot open this GPU: {e}; the other GPUs are probed without it"),
            )),
        }
    }
    (opened, checks)
}

/// Runs the phase. Err means NVML could not look at any GPU, or `devices` names none that exists.
pub fn run(
    policy: &[ModelPolicy],
    devices: Option<&[u32]>,
) -> Result<(Facts, Vec<Found>), Failure> {
    let nvml = Nvml::init().map_err(Failure::from_init)?;
    let driver_error = |e: NvmlError| Failure::Driver(format!("NVML: {e}"));
    let mut checks: Vec<Found> = Vec::new();
    let mut facts = Facts {
        driver: nvml.sys_driver_version().map_err(driver_error)?,
        ..Facts::default()
    };
    let cuda = nvml.sys_cuda_driver_version().map_err(driver_error)?;
    facts.cuda = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
    checks.push((
        "driver".into(),
        Status::Pass,
        format!("{} (supports CUDA {})", facts.driver, facts.cuda),
    ));
    facts.count = nvml.device_count().map_err(driver_error)?;
    let spec = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let shown = match (devices, spec.as_deref()) {
        (None, Some(spec)) => {
            let uuids: Vec<(u32, String)> = (0..facts.count)
                .map(|i| {
                    let uuid = nvml.device_by_index(i).and_then(|d| d.uuid());
                    (i, uuid.unwrap_or_default())
                })
                .collect();
            let shown = cuda_visible(Some(spec), &uuids).unwrap_or_default();
            if shown.is_empty() {
                return Err(Failure::Driver(format!(
                    "CUDA_VISIBLE_DEVICES={spec:?} shows this process none of the {} GPUs NVML \
                     sees, so CUDA can open none",
                    facts.count
                )));
            }
            Some(shown)
        }
        _ => None,
    };
    let wanted = select_devices(devices.or(shown.as_deref()), facts.count)?;
    let (opened, failed) = open_each(&wanted, |i| nvml.device_by_index(i));
    checks.extend(failed);
    let indices: Vec<u32> = opened.iter().map(|(i, _)| *i).collect();
    let mut handles = Vec::new();
    for (i, d) in opened {
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
        facts.affinity.push(affinity(&d, i));
        facts.gpus.push(gpu);
        handles.push(d);
    }
    (facts.topology, facts.p2p) = pair_matrices(&nvml, &handles, &indices);
    if handles.len() > 1 {
        checks.push(p2p_status(&facts.p2p, &indices));
    }
    Ok((facts, checks))
}

/// The topology and P2P matrices of the opened GPUs, rows and columns in `handles`' order:
/// the common ancestor of each pair (PIX, PXB, PHB, NODE, SYS) and whether P2P reads work.
fn pair_matrices(
    nvml: &Nvml,
    handles: &[nvml_wrapper::Device],
    indices: &[u32],
) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let (mut topology, mut p2p_rows) = (Vec::new(), Vec::new());
    for (ai, a) in handles.iter().enumerate() {
        let mut topo = Vec::new();
        let mut p2p = Vec::new();
        for (bi, b) in handles.iter().enumerate() {
            if ai == bi {
                topo.push("X".into());
                p2p.push("X".into());
                continue;
            }
            // The topology call takes the other GPU by value: open it once more.
            let level = nvml
                .device_by_index(indices[bi])
                .and_then(|other| a.topology_common_ancestor(other));
            topo.push(match level {
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
        topology.push(topo);
        p2p_rows.push(p2p);
    }
    (topology, p2p_rows)
}

/// One check over the P2P matrix: every pair of GPUs can read each other's memory. Rows and
/// columns follow the opened GPUs; they are named by NVML index, which differs from the
/// position when a GPU did not open or --devices picked some.
fn p2p_status(p2p: &[Vec<String>], indices: &[u32]) -> Found {
    let blocked: Vec<String> = p2p
        .iter()
        .enumerate()
        .flat_map(|(i, row)| {
            row.iter()
                .enumerate()
                .filter(|(_, s)| *s != "X" && *s != "Ok")
                .map(move |(j, s)| format!("{}->{}: {s}", indices[i], indices[j]))
        })
        .collect();
    (
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
    )
}

/// Words of CPU mask asked of NVML: 4096 CPUs, more than any node has, so none is cut off.
const AFFINITY_WORDS: usize = 64;

fn affinity(d: &nvml_wrapper::Device, index: u32) -> GpuAffinity {
    let mut unreadable = Vec::new();
    let cpus = match d.cpu_affinity(AFFINITY_WORDS) {
        Ok(words) => Some(ranges(&cpus_in_mask(&words))),
        Err(e) => {
            unreadable.push(format!("CPU affinity: {e}"));
            None
        }
    };
    let numa_node = match d.numa_node_id() {
        // NVML's -1, read unsigned: the kernel knows no NUMA node for the GPU's PCI device.
        Ok(u32::MAX) => {
            unreadable.push("NUMA node: the kernel knows none for this GPU".to_string());
            None
        }
        Ok(node) => Some(node),
        Err(e) => {
            unreadable.push(format!("NUMA node: {e}"));
            None
        }
    };
    GpuAffinity {
        index,
        cpus,
        numa_node,
        unreadable,
    }
}

/// The CPUs set in NVML's mask, ascending: bit b of word w is CPU w * (bits per word) + b
/// (nvmlDeviceGetCpuAffinity).
pub fn cpus_in_mask(words: &[std::os::raw::c_ulong]) -> Vec<u32> {
    let bits = std::os::raw::c_ulong::BITS;
    let mut cpus = Vec::new();
    for (w, word) in (0u32..).zip(words) {
        for b in 0..bits {
            if (word >> b) & 1 == 1 {
                cpus.push(w * bits + b);
            }
        }
    }
    cpus
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_that_does_not_open_fails_alone() {
        let (opened, checks) = open_each(&[0, 1, 2], |i| {
            if i == 1 {
                Err("Unknown Error")
            } else {
                Ok(format!("handle {i}"))
            }
        });
        let kept: Vec<u32> = opened.iter().map(|(i, _)| *i).collect();
        assert_eq!(kept, [0, 2]);
        assert_eq!(checks.len(), 1);
        let (name, status, detail) = &checks[0];
        assert_eq!((name.as_str(), *status), ("GPU 1", Status::Fail));
        assert!(detail.contains("Unknown Error"), "{detail}");
    }

    #[test]
    fn cpu_masks_read_bit_by_bit_across_words() {
        let bits = std::os::raw::c_ulong::BITS;
        // CPUs 0-3 in the first word and the first CPU of the second.
        assert_eq!(cpus_in_mask(&[0b1111, 1]), vec![0, 1, 2, 3, bits]);
        assert!(cpus_in_mask(&[0, 0]).is_empty());
        assert_eq!(
            cpus_in_mask(&[std::os::raw::c_ulong::MAX]).len(),
            bits as usize
        );
    }

    #[test]
    fn cuda_visible_devices_picks_and_orders_the_gpus_cuda_shows() {
        let gpus: Vec<(u32, String)> = vec![
            (0, "GPU-aaaa1111-0000".into()),
            (1, "GPU-bbbb2222-0000".into()),
        ];
        assert_eq!(cuda_visible(None, &gpus), None);
        assert_eq!(cuda_visible(Some("1"), &gpus), Some(vec![1]));
        assert_eq!(cuda_visible(Some("1,0"), &gpus), Some(vec![1, 0]));
        assert_eq!(cuda_visible(Some("GPU-bbbb, 0"), &gpus), Some(vec![1, 0]));
        // CUDA stops at the first entry it cannot read, and skips an index past the last GPU.
        assert_eq!(cuda_visible(Some("0,x,1"), &gpus), Some(vec![0]));
        assert_eq!(cuda_visible(Some("7,1"), &gpus), Some(vec![1]));
        assert_eq!(cuda_visible(Some(""), &gpus), Some(vec![]));
        assert_eq!(cuda_visible(Some("-1"), &gpus), Some(vec![]));
    }

    #[test]
    fn devices_past_the_last_gpu_are_bad_input() {
        assert_eq!(select_devices(None, 2), Ok(vec![0, 1]));
        assert_eq!(select_devices(Some(&[1, 0, 1]), 2), Ok(vec![1, 0]));
        let Err(Failure::NoSuchDevice(text)) = select_devices(Some(&[0, 7]), 2) else {
            panic!("index 7 of 2 GPUs was accepted");
        };
        assert!(
            text.contains("index 7") && text.contains("2 GPUs"),
            "{text}"
        );
        assert!(matches!(
            select_devices(Some(&[0]), 0),
            Err(Failure::NoSuchDevice(_))
        ));
        assert!(matches!(
            select_devices(Some(&[]), 4),
            Err(Failure::NoSuchDevice(_))
        ));
    }

    #[test]
    fn a_missing_dependency_is_told_apart_from_a_missing_driver() {
        let absent = load_failure(
            "libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
        );
        assert!(matches!(absent, Failure::LibraryNotFound(_)), "{absent:?}");

        let glibc = load_failure(
            "libpthread.so.0: cannot open shared object file: No such file or directory",
        );
        assert_eq!(
            glibc,
            Failure::LibraryUnloadable {
                dlerror:
                    "libpthread.so.0: cannot open shared object file: No such file or directory"
                        .into(),
                missing: Some("libpthread.so.0".into()),
            }
        );
        let text = glibc.explain();
        assert!(
            text.contains("libpthread.so.0: cannot open shared object file"),
            "{text}"
        );
        assert!(
            text.contains("libpthread.so.0, libdl.so.2, librt.so.1, libm.so.6"),
            "{text}"
        );
        assert!(!text.contains("install the NVIDIA driver"), "{text}");

        let musl = load_failure(
            "Error loading shared library libdl.so.2: No such file or directory (needed by /usr/lib/libnvidia-ml.so.1)",
        );
        assert!(
            matches!(&musl, Failure::LibraryUnloadable { missing: Some(m), .. } if m == "libdl.so.2"),
            "{musl:?}"
        );

        let other = load_failure("/usr/lib/libnvidia-ml.so.1: wrong ELF class: ELFCLASS32");
        assert!(
            matches!(&other, Failure::LibraryUnloadable { missing: None, .. }),
            "{other:?}"
        );
        assert!(other.explain().contains("wrong ELF class"));
    }
}
