//! The verdicts on NCCL's effective configuration, from its own log (nccl_log.rs): per
//! variable of the image's preset whether NCCL applied it, the transport between each pair of
//! GPUs against what the preset expects, the algorithm and protocol per size, and per GPU
//! where it sits relative to the CPUs, with a launch line that binds its rank there. Each
//! decision is a plain function of plain data, so recorded logs test it without a GPU.

use super::limits;
use super::nccl_log::{self, Affinity, ChannelCounts, Choice, Link, LinkKind, NcclLog};
use super::nvml::GpuAffinity;
use super::report::{Report, Status};
use crate::nccl::params::ParamTable;
use crate::version::Version;

/// The phase of the NCCL checks.
pub const PHASE: &str = "nccl";
/// The phase of the per-GPU affinity checks.
pub const AFFINITY_PHASE: &str = "affinity";

/// What the probe sets itself for the logged run, overriding the image: the log's level, its
/// subsystems and file, and multicast, which stays off on the machines the probe runs on.
pub const SET_BY_PROBE: &[&str] = &[
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_FILE",
    "NCCL_NVLS_ENABLE",
];

/// Prefixes of variables NCCL reads only when it sets up a network transport.
const NETWORK_PREFIXES: &[&str] = &[
    "NCCL_IB_",
    "NCCL_NET_",
    "NCCL_SOCKET_",
    "NCCL_NSOCKS_",
    "NCCL_GDR",
    "NCCL_COLLNET",
    "NCCL_CROSS_NIC",
];

/// The first PyTorch whose torchrun binds each worker to its GPU's NUMA node itself
/// (`--numa-binding`, torch/numa/binding.py, PyTorch 2.9).
const TORCHRUN_NUMA_BINDING_SINCE: &str = "2.9";

/// Every NCCL check of one logged run: one per preset variable, the transports, the algorithm
/// and protocol per size. `expects_nvlink` says why NVLink P2P is expected, if it is.
pub fn nccl_checks(
    log: &NcclLog,
    preset: &[(String, String)],
    expects_nvlink: Option<&str>,
    table: &ParamTable,
    report: &mut Report,
) {
    if preset.is_empty() {
        report.push(
            PHASE,
            "preset variables",
            Status::Skip,
            "the image sets no NCCL_* variable: NCCL ran on its defaults",
        );
    }
    for (name, value) in preset {
        let (status, detail) = variable_verdict(name, value, log, table);
        report.push(PHASE, name.clone(), status, detail);
    }
    let (status, detail) = transport_verdict(&log.links, &log.channels, expects_nvlink);
    report.push(PHASE, "transports", status, detail);
    let (status, detail) = algorithm_summary(&log.choices);
    report.push(PHASE, "algorithm per size", status, detail);
}

/// Whether NCCL applied `name=given`: PASS when it logged the value (as given, or in its own
/// spelling), FAIL when it refused it or read it as another number, WARN when it logged
/// nothing about it, with why that happens.
pub fn variable_verdict(
    name: &str,
    given: &str,
    log: &NcclLog,
    table: &ParamTable,
) -> (Status, String) {
    if SET_BY_PROBE.contains(&name) {
        return (
            Status::Skip,
            format!("the probe sets it for this run, so NCCL did not see the image's `{given}`"),
        );
    }
    let refused = log.rejected.iter().find(|r| match &r.name {
        Some(n) => n == name,
        None => r.value.as_deref() == Some(given),
    });
    if let Some(r) = refused {
        return (
            Status::Fail,
            format!("NCCL refused `{given}`, in its words: {}", r.words),
        );
    }
    if let Some(applied) = log.applied.iter().find(|a| a.name == name) {
        let read = &applied.value;
        if same_value(given, read) {
            return (Status::Pass, format!("applied: NCCL read `{read}`"));
        }
        if c_integer(read).is_some() && c_integer(given).is_none() {
            return (
                Status::Fail,
                format!(
                    "NCCL read `{given}` as {read}: it parses this variable as a number and stops at the first character that is not a digit"
                ),
            );
        }
        return (
            Status::Pass,
            format!("applied: NCCL read `{given}` as `{read}`"),
        );
    }
    (
        Status::Warn,
        format!(
            "NCCL logged no use of `{given}` in this run: {}",
            why_unread(name, log, table)
        ),
    )
}

/// Why NCCL may not have logged a variable, as precisely as the log and the table allow.
fn why_unread(name: &str, log: &NcclLog, table: &ParamTable) -> String {
    // src/graph/paths.cc, ncclGetLevel: NCCL_P2P_DISABLE=1 settles the level unread.
    let p2p_disabled = log
        .applied
        .iter()
        .any(|a| a.name == "NCCL_P2P_DISABLE" && a.value == "1");
    if name == "NCCL_P2P_LEVEL" && p2p_disabled {
        return "NCCL_P2P_DISABLE=1 turns P2P off before NCCL looks at the level".to_string();
    }
    let running: Option<Version> = log
        .version
        .as_deref()
        .and_then(|v| v.split('+').next())
        .and_then(|v| v.parse().ok());
    if let Some(param) = table.get(name) {
        if param.unused {
            return "NCCL defines it but never reads it".to_string();
        }
        if let Some(running) = &running
            && param.since > *running
        {
            return format!("NCCL {running} predates it (read since {})", param.since);
        }
    }
    if NETWORK_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return "NCCL reads it only when it uses a network transport, which GPUs of one node use only when P2P and SHM are off".to_string();
    }
    "NCCL reads some variables only on some paths (other collectives, transports, several nodes), and logs some only when they change its choice (NCCL_P2P_DISABLE=0, or an NCCL_P2P_LEVEL it does not recognise, prints nothing)".to_string()
}

/// The same value as NCCL printed it: equal text, or equal integers the way NCCL parses them.
fn same_value(given: &str, read: &str) -> bool {
    given.trim() == read
        || matches!((c_integer(given), c_integer(read)), (Some(a), Some(b)) if a == b)
}

/// `text` as a whole integer the way strtoll with base 0 reads it (`0x10`, `010`, `16`);
/// None when anything but the number is there.
fn c_integer(text: &str) -> Option<i64> {
    let text = text.trim_start();
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (radix, digits) = if let Some(hex) = unsigned
        .strip_prefix("0x")
        .or_else(|| unsigned.strip_prefix("0X"))
    {
        (16, hex)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') {
        (8, &unsigned[1..])
    } else {
        (10, unsigned)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i64::from_str_radix(digits, radix).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

/// The transports NCCL took between GPUs. FAIL when NVLink P2P is expected and a pair went
/// through host memory (SHM) or the network stack (NET): on one node that means NCCL found
/// no usable NVLink path between them.
pub fn transport_verdict(
    links: &[Link],
    channels: &[ChannelCounts],
    expects_nvlink: Option<&str>,
) -> (Status, String) {
    if links.is_empty() {
        return (
            Status::Warn,
            "NCCL logged no channel connection, so the transports are unknown".to_string(),
        );
    }
    let describe = |l: &Link| {
        format!(
            "GPU {} -> GPU {}: {} (channels {})",
            l.from_gpu,
            l.to_gpu,
            l.via,
            nccl_log::ranges(&l.channels)
        )
    };
    let off_nvlink: Vec<String> = links
        .iter()
        .filter(|l| matches!(l.transport(), LinkKind::Shm | LinkKind::Net))
        .map(describe)
        .collect();
    if let Some(why) = expects_nvlink
        && !off_nvlink.is_empty()
    {
        return (
            Status::Fail,
            format!(
                "the preset expects NVLink P2P ({why}), but NCCL went around it: {}; NCCL found no usable NVLink path between these GPUs (no NVLink, or peer access blocked)",
                off_nvlink.join("; ")
            ),
        );
    }
    let mut detail: Vec<String> = links.iter().map(describe).collect();
    for c in channels {
        detail.push(format!(
            "{} coll channels, {} nvls channels, {} p2p channels ({} per peer)",
            c.coll, c.nvls, c.p2p, c.p2p_per_peer
        ));
    }
    (Status::Pass, detail.join("; "))
}

/// What NCCL's log says of its IB transport, for an image or node that needs it: FAIL when
/// NCCL could not open libibverbs (it then runs across nodes over TCP sockets), PASS when it
/// opened it (naming the devices it found, or that this node has none), WARN when the log
/// says nothing of it.
pub fn ib_verdict(log: &NcclLog) -> (Status, String) {
    let said = |part: &str| log.ib.iter().find(|l| l.contains(part));
    if let Some(line) = log
        .ib
        .iter()
        .find(|l| l.contains("libibverbs") && l.to_ascii_lowercase().contains("fail"))
    {
        return (
            Status::Fail,
            format!(
                "NCCL could not open libibverbs (\"{line}\"): across nodes it would run over TCP \
                 sockets; the image needs `system: [libibverbs1, ibverbs-providers]`"
            ),
        );
    }
    if let Some(line) = said("NET/IB : Using [0]") {
        return (Status::Pass, format!("NCCL opened libibverbs: \"{line}\""));
    }
    if let Some(line) = said("No device found") {
        return (
            Status::Pass,
            format!(
                "NCCL opened libibverbs and found no RDMA device on this node (\"{line}\"), \
                 so it used sockets here"
            ),
        );
    }
    if log.ib.is_empty() {
        return (
            Status::Warn,
            "NCCL's log says nothing of its IB transport, so whether it loads is unknown"
                .to_string(),
        );
    }
    (
        Status::Warn,
        format!("NCCL's IB transport: \"{}\"", log.ib.join("\"; \"")),
    )
}

/// The algorithm and protocol NCCL picked per collective and size, for the reader.
pub fn algorithm_summary(choices: &[Choice]) -> (Status, String) {
    if choices.is_empty() {
        return (
            Status::Skip,
            "NCCL logged no algorithm choice: NCCL 2.23 and later print one per call on rank 0 with NCCL_DEBUG_SUBSYS=TUNING".to_string(),
        );
    }
    let mut collectives: Vec<&str> = choices.iter().map(|c| c.collective.as_str()).collect();
    collectives.dedup();
    let mut parts = Vec::new();
    for collective in collectives {
        let mut sizes: Vec<String> = Vec::new();
        let mine: Vec<&Choice> = choices
            .iter()
            .filter(|c| c.collective == collective)
            .collect();
        let mut bytes: Vec<u64> = mine.iter().map(|c| c.bytes).collect();
        bytes.dedup();
        for b in bytes {
            let picked: Vec<String> = mine
                .iter()
                .filter(|c| c.bytes == b)
                .map(|c| format!("{}/{}", c.algorithm, c.protocol))
                .collect();
            sizes.push(format!("{} {}", size_label(b), picked.join(" or ")));
        }
        parts.push(format!("{collective}: {}", sizes.join(", ")));
    }
    (Status::Pass, parts.join("; "))
}

/// `1 KiB`, `64 MiB`, `1 GiB` where exact, else bytes.
fn size_label(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// Why NVLink P2P is expected between the GPUs, if it is: NCCL_P2P_LEVEL allows P2P only over
/// NVLink (NVL, or NVB through a GPU in between), or the image was built with gpubake's
/// `nvlink` preset. NCCL compares the level with strcmp, so only these spellings count.
pub fn expects_nvlink(preset: &[(String, String)], image_presets: &[&str]) -> Option<String> {
    let level = preset
        .iter()
        .find(|(k, v)| k == "NCCL_P2P_LEVEL" && matches!(v.as_str(), "NVL" | "NVB"));
    if let Some((k, v)) = level {
        return Some(format!("{k}={v}"));
    }
    image_presets
        .contains(&"nvlink")
        .then(|| "the image's preset `nvlink`".to_string())
}

/// The node's CPUs and NUMA nodes, as the kernel lists them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Machine {
    /// CPUs present.
    pub cpus: Option<usize>,
    /// NUMA nodes online.
    pub numa_nodes: Option<usize>,
}

/// Whether the container lets a rank bind its memory to a NUMA node, as the limits phase
/// found by trying (limits.rs, `try_memory_binding`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryBind {
    /// Not tried, or nothing to bind to: the line binds memory as it would anywhere.
    #[default]
    Unknown,
    /// set_mempolicy was allowed.
    Allowed,
    /// set_mempolicy was refused, so `numactl --membind` would fail before the job starts.
    Refused,
}

impl From<Option<&limits::MemoryBinding>> for MemoryBind {
    fn from(outcome: Option<&limits::MemoryBinding>) -> Self {
        match outcome.and_then(limits::MemoryBinding::allowed) {
            Some(true) => MemoryBind::Allowed,
            Some(false) => MemoryBind::Refused,
            None => MemoryBind::Unknown,
        }
    }
}

/// How the job is launched: what its launch line can use.
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// The image's PyTorch, when known.
    pub torch: Option<Version>,
    /// Ranks on the node, one per GPU.
    pub ranks: usize,
    /// The image has numactl on its PATH.
    pub numactl: bool,
    /// Whether memory may be bound to a node here.
    pub memory_binding: MemoryBind,
}

/// Where one GPU sits and how to launch its rank there. WARN "topology hidden" when NVML or
/// NCCL cannot place it: an empty or missing mask, every CPU of a multi-node machine, or
/// NCCL's empty affinity; a launch line there would be a guess.
pub fn affinity_verdict(
    gpu: &GpuAffinity,
    local_rank: usize,
    nccl: Option<&Affinity>,
    machine: &Machine,
    launch: &Launch,
) -> (Status, String) {
    if let Some(n) = nccl.filter(|n| n.cpus.is_none()) {
        return match n.gpu_cpus.as_deref().filter(|c| !c.is_empty()) {
            Some(near) => (
                Status::Warn,
                format!(
                    "the process may run on none of the CPUs near this GPU ({near}): the container's CPU set leaves its NUMA node out, so its threads run remote; NCCL: \"{}\"",
                    n.words
                ),
            ),
            None => (
                Status::Warn,
                format!(
                    "topology hidden: NCCL knows no CPU near this GPU (\"{}\"); no launch line, as any binding would be a guess",
                    n.words
                ),
            ),
        };
    }
    let Some(list) = gpu.cpus.as_deref() else {
        return (
            Status::Warn,
            format!(
                "topology hidden: NVML gives no CPU affinity ({}); no launch line, as any binding would be a guess",
                gpu.unreadable.join("; ")
            ),
        );
    };
    let cpus = nccl_log::parse_ranges(list).unwrap_or_default();
    if cpus.is_empty() {
        return (
            Status::Warn,
            "topology hidden: NVML's CPU mask for this GPU is empty; no launch line, as any binding would be a guess".to_string(),
        );
    }
    let node = gpu
        .numa_node
        .map(|k| format!(", NUMA node {k}"))
        .unwrap_or_default();
    if machine.numa_nodes == Some(1) {
        return (
            Status::Pass,
            format!(
                "CPUs {list}{node}; one NUMA node, so every CPU is as near as any and no binding is needed: torchrun --nproc-per-node {} train.py",
                launch.ranks
            ),
        );
    }
    let every_cpu = machine
        .cpus
        .is_some_and(|n| cpus.len() >= n || cpus.iter().any(|&c| c as usize >= n));
    if every_cpu {
        let nodes = machine
            .numa_nodes
            .map(|n| format!("{n} NUMA nodes"))
            .unwrap_or_else(|| "NUMA nodes the kernel does not list".to_string());
        return (
            Status::Warn,
            format!(
                "topology hidden: NVML calls every CPU ({list}) near this GPU on a machine with {nodes}; no launch line, as any binding would be a guess"
            ),
        );
    }
    (
        Status::Pass,
        format!(
            "CPUs {list}{node}; launch: {}",
            launch_line(launch, local_rank, gpu.numa_node, list)
        ),
    )
}

/// The launch that binds local rank `local_rank` near its GPU: torchrun's own NUMA binding
/// where the image's PyTorch has it and the GPU's node is known, else numactl per rank; in an
/// image without numactl, taskset (util-linux) for the CPUs, saying what numactl would add.
/// Memory is bound to the node only where the container allows set_mempolicy: where it
/// refuses, `numactl --membind` fails before the job starts, so the line binds the CPUs alone
/// and says what memory binding needs. torchrun's `node` binding binds CPUs only (numactl
/// `--cpunodebind` or sched_setaffinity, torch/numa/binding.py), so it stands either way.
pub fn launch_line(launch: &Launch, local_rank: usize, node: Option<u32>, cpus: &str) -> String {
    let since: Version = TORCHRUN_NUMA_BINDING_SINCE
        .parse()
        .expect("a literal version");
    let refused = launch.memory_binding == MemoryBind::Refused;
    let needs_nice = |k: u32| {
        format!(
            "`--membind={k}` needs CAP_SYS_NICE here (`docker run --cap-add SYS_NICE`; \
             Kubernetes: `capabilities.add: [\"SYS_NICE\"]`): the container refuses \
             set_mempolicy, as Docker's default seccomp profile does without it"
        )
    };
    match (node, &launch.torch) {
        (Some(_), Some(torch)) if *torch >= since => format!(
            "torchrun --nproc-per-node {} --numa-binding node train.py",
            launch.ranks
        ),
        _ if !launch.numactl => {
            let line = format!(
                "taskset -c {cpus} python train.py (local rank {local_rank}); the image has no \
                 numactl, which would bind the CPUs"
            );
            match node {
                Some(k) if refused => {
                    format!("{line}: add `system: [numactl]`; {}", needs_nice(k))
                }
                Some(k) => format!("{line} and memory to NUMA node {k}: add `system: [numactl]`"),
                None => format!("{line}: add `system: [numactl]`"),
            }
        }
        (Some(k), _) if refused => format!(
            "numactl --cpunodebind={k} python train.py (local rank {local_rank}); {}",
            needs_nice(k)
        ),
        (Some(k), _) => format!(
            "numactl --cpunodebind={k} --membind={k} python train.py (local rank {local_rank})"
        ),
        (None, _) => {
            format!("numactl --physcpubind={cpus} python train.py (local rank {local_rank})")
        }
    }
}

/// One affinity check per GPU. `in_rank_order` lists NVML indices by local rank (CUDA's PCI
/// order); NCCL's log, where it ran, adds what NCCL itself bound to.
pub fn affinity_checks(
    gpus: &[GpuAffinity],
    in_rank_order: &[u32],
    nccl: Option<&NcclLog>,
    machine: &Machine,
    launch: &Launch,
    report: &mut Report,
) {
    for (local_rank, index) in in_rank_order.iter().enumerate() {
        let Some(gpu) = gpus.iter().find(|g| g.index == *index) else {
            continue;
        };
        let said = nccl.and_then(|log| log.affinity.iter().find(|a| a.gpu == *index));
        let (status, detail) = affinity_verdict(gpu, local_rank, said, machine, launch);
        report.push(
            AFFINITY_PHASE,
            format!("GPU {index} CPU affinity"),
            status,
            detail,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUMEM: &str = include_str!("../../tests/fixtures/nccl-logs/p2p-cumem-2.28.log");
    const SHM: &str = include_str!("../../tests/fixtures/nccl-logs/shm-hidden-affinity-2.28.log");
    const SOCKET: &str = include_str!("../../tests/fixtures/nccl-logs/net-socket-2.28.log");

    #[test]
    fn the_ib_transport_is_read_from_what_nccl_said_of_it() {
        // Recorded on the H200 machines, which have libibverbs and no RDMA device.
        let log = NcclLog::parse(include_str!(
            "../../tests/fixtures/nccl-logs/h200x2-comm-init-all-2.28.9.log"
        ));
        assert_eq!(
            log.ib,
            [
                "NET/IB : No device found.",
                "NET/IB : Using [RO]; OOB eth0:192.0.2.2<0>",
                "Failed to initialize NET plugin IB"
            ]
        );
        let (status, detail) = ib_verdict(&log);
        assert_eq!(status, Status::Pass, "{detail}");
        assert!(
            detail.contains("found no RDMA device on this node"),
            "{detail}"
        );
        // A log that never mentions the transport proves nothing.
        let (status, detail) = ib_verdict(&NcclLog::default());
        assert_eq!(status, Status::Warn, "{detail}");
        // Devices found: named as NCCL named them.
        let found = NcclLog::parse(
            "n1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>\n",
        );
        let (status, detail) = ib_verdict(&found);
        assert_eq!(status, Status::Pass);
        assert!(
            detail.contains("[0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE"),
            "{detail}"
        );
    }

    #[test]
    fn the_ib_lines_recorded_with_and_without_libibverbs_give_their_verdicts() {
        // What NCCL 2.28.9 said in preflight images under crun on the one-GPU H200 machine
        // (benches/results/system-h200-2026-12-02): without the packages, with them, and
        // with them under the roce preset.
        let recorded: serde_json::Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/nccl-logs/ib-h200-2026-12-02.json"
        ))
        .unwrap();
        let verdict = |name: &str| {
            let log = NcclLog {
                ib: serde_json::from_value(recorded[name]["ib"].clone()).unwrap(),
                ..NcclLog::default()
            };
            ib_verdict(&log)
        };
        let (status, detail) = verdict("without");
        assert_eq!(status, Status::Fail, "{detail}");
        assert!(
            detail.contains("\"Failed to open libibverbs.so[.1]\""),
            "{detail}"
        );
        for name in ["with", "roce"] {
            let (status, detail) = verdict(name);
            assert_eq!(status, Status::Pass, "{name}: {detail}");
            assert!(detail.contains("found no RDMA device"), "{detail}");
        }
    }

    fn table() -> &'static ParamTable {
        ParamTable::embedded()
    }

    fn preset(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_preset_variable_is_applied_refused_misread_or_unread() {
        let log = NcclLog::parse(CUMEM);
        let verdict = |name, given| variable_verdict(name, given, &log, table());
        assert_eq!(verdict("NCCL_P2P_LEVEL", "NVL").0, Status::Pass);
        // 0x1 is 1 to strtoll.
        assert_eq!(verdict("NCCL_CUMEM_ENABLE", "0x1").0, Status::Pass);
        let (status, detail) = verdict("NCCL_MIN_NCHANNELS", "99999999999999999999");
        assert_eq!(status, Status::Fail);
        assert!(
            detail.contains("Invalid value 99999999999999999999 for NCCL_MIN_NCHANNELS"),
            "{detail}"
        );
        // `8M` became 8 bytes: NCCL took it, but not as meant.
        let (status, detail) = verdict("NCCL_BUFFSIZE", "8M");
        assert_eq!(status, Status::Fail, "{detail}");
        assert!(detail.contains("as 8"), "{detail}");
        let (status, detail) = verdict("NCCL_IB_TIMEOUT", "22");
        assert_eq!(status, Status::Warn);
        assert!(detail.contains("network transport"), "{detail}");
        let (status, _) = verdict("NCCL_DEBUG", "WARN");
        assert_eq!(status, Status::Skip);
    }

    #[test]
    fn a_value_named_only_by_its_text_is_matched_to_its_variable() {
        let log = NcclLog::parse(
            "h:1:1 [0] tuning.cc:104 NCCL WARN Unrecognized element token \"tre\" when parsing \"ring,tre\"\n",
        );
        let (status, detail) = variable_verdict("NCCL_ALGO", "ring,tre", &log, table());
        assert_eq!(status, Status::Fail);
        assert!(detail.contains("Unrecognized element token"), "{detail}");
        assert_eq!(
            variable_verdict("NCCL_PROTO", "LL128", &log, table()).0,
            Status::Warn
        );
    }

    #[test]
    fn a_variable_newer_than_the_running_nccl_says_so() {
        let log = NcclLog::parse("h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n");
        let (status, detail) = variable_verdict("NCCL_CHECK_MODE", "DEBUG_LOCAL", &log, table());
        assert_eq!(status, Status::Warn);
        assert!(detail.contains("NCCL 2.21.5 predates it"), "{detail}");
    }

    #[test]
    fn strtoll_numbers_compare_by_value() {
        assert_eq!(c_integer("0x10"), Some(16));
        assert_eq!(c_integer("010"), Some(8));
        assert_eq!(c_integer("-2"), Some(-2));
        assert_eq!(c_integer(" 7"), Some(7));
        assert_eq!(c_integer("8M"), None);
        assert_eq!(c_integer("0x"), None);
        assert_eq!(c_integer("+-1"), None);
        assert_eq!(c_integer("99999999999999999999"), None);
        assert!(same_value("0x10", "16"));
        assert!(!same_value("NVL", "PIX"));
    }

    #[test]
    fn shm_or_sockets_under_an_nvlink_preset_fail() {
        for fixture in [SHM, SOCKET] {
            let log = NcclLog::parse(fixture);
            let (status, detail) =
                transport_verdict(&log.links, &log.channels, Some("NCCL_P2P_LEVEL=NVL"));
            assert_eq!(status, Status::Fail, "{detail}");
            assert!(
                detail.contains("NCCL_P2P_LEVEL=NVL") && detail.contains("GPU 0 -> GPU 1"),
                "{detail}"
            );
            // Without the expectation the same transports are only listed.
            let (status, _) = transport_verdict(&log.links, &log.channels, None);
            assert_eq!(status, Status::Pass);
        }
        let log = NcclLog::parse(SOCKET);
        let (_, detail) = transport_verdict(&log.links, &log.channels, Some("x"));
        assert!(detail.contains("NET/Socket/0"), "{detail}");
    }

    #[test]
    fn p2p_under_an_nvlink_preset_passes_and_lists_each_pair() {
        let log = NcclLog::parse(CUMEM);
        let (status, detail) = transport_verdict(&log.links, &log.channels, Some("x"));
        assert_eq!(status, Status::Pass, "{detail}");
        assert!(
            detail.contains("GPU 0 -> GPU 1: P2P/CUMEM/read (channels 0-3)")
                && detail.contains("GPU 1 -> GPU 0: P2P/CUMEM/read (channels 0-3)")
                && detail.contains("4 coll channels"),
            "{detail}"
        );
        let (status, _) = transport_verdict(&[], &[], Some("x"));
        assert_eq!(status, Status::Warn, "no lines is no evidence either way");
    }

    #[test]
    fn a_recorded_single_process_run_on_h200s_passes_its_nvlink_preset() {
        let log = NcclLog::parse(include_str!(
            "../../tests/fixtures/nccl-logs/h200x2-comm-init-all-2.28.9.log"
        ));
        let mut report = Report::default();
        let preset = preset(&[("NCCL_P2P_LEVEL", "NVL"), ("NCCL_NVLS_ENABLE", "0")]);
        nccl_checks(
            &log,
            &preset,
            Some("NCCL_P2P_LEVEL=NVL"),
            table(),
            &mut report,
        );
        let statuses: Vec<(&str, Status)> = report
            .checks
            .iter()
            .map(|c| (c.name.as_str(), c.status))
            .collect();
        assert_eq!(
            statuses,
            vec![
                ("NCCL_P2P_LEVEL", Status::Pass),
                ("NCCL_NVLS_ENABLE", Status::Skip),
                ("transports", Status::Pass),
                ("algorithm per size", Status::Pass),
            ]
        );
        // Its VM showed NVML every CPU and NCCL none: hidden, whatever NVML claims.
        let (status, detail) = affinity_verdict(
            &gpu(0, Some("0-31"), None),
            0,
            log.affinity.first(),
            &Machine {
                cpus: Some(32),
                numa_nodes: Some(1),
            },
            &Launch::default(),
        );
        assert_eq!(status, Status::Warn);
        assert!(detail.starts_with("topology hidden"), "{detail}");
    }

    #[test]
    fn nvlink_is_expected_from_the_level_or_the_image_preset() {
        assert_eq!(
            expects_nvlink(&preset(&[("NCCL_P2P_LEVEL", "NVL")]), &[]).as_deref(),
            Some("NCCL_P2P_LEVEL=NVL")
        );
        assert_eq!(
            expects_nvlink(&preset(&[("NCCL_P2P_LEVEL", "PXB")]), &["base", "pcie"]),
            None
        );
        assert!(expects_nvlink(&[], &["base", "nvlink"]).is_some());
    }

    #[test]
    fn algorithms_are_listed_per_size() {
        let log = NcclLog::parse(CUMEM);
        let (status, detail) = algorithm_summary(&log.choices);
        assert_eq!(status, Status::Pass);
        assert_eq!(
            detail,
            "AllReduce: 1 KiB RING/LL, 1 MiB RING/LL128, 256 MiB RING/SIMPLE"
        );
        assert_eq!(algorithm_summary(&[]).0, Status::Skip);
    }

    fn gpu(index: u32, cpus: Option<&str>, node: Option<u32>) -> GpuAffinity {
        GpuAffinity {
            index,
            cpus: cpus.map(String::from),
            numa_node: node,
            unreadable: if cpus.is_none() {
                vec!["CPU affinity: Not supported".into()]
            } else {
                vec![]
            },
        }
    }

    const TWO_SOCKETS: Machine = Machine {
        cpus: Some(224),
        numa_nodes: Some(2),
    };

    #[test]
    fn a_placed_gpu_gets_a_launch_line_that_binds_it() {
        let old_torch = Launch {
            torch: Some("2.8.0".parse().unwrap()),
            ranks: 8,
            numactl: true,
            memory_binding: MemoryBind::Unknown,
        };
        let g = gpu(5, Some("56-111,168-223"), Some(1));
        let (status, detail) = affinity_verdict(&g, 5, None, &TWO_SOCKETS, &old_torch);
        assert_eq!(status, Status::Pass);
        assert!(
            detail.contains("CPUs 56-111,168-223, NUMA node 1")
                && detail.contains("numactl --cpunodebind=1 --membind=1")
                && detail.contains("local rank 5"),
            "{detail}"
        );
        let new_torch = Launch {
            torch: Some("2.9.1".parse().unwrap()),
            ranks: 8,
            numactl: true,
            memory_binding: MemoryBind::Unknown,
        };
        let (_, detail) = affinity_verdict(&g, 5, None, &TWO_SOCKETS, &new_torch);
        assert!(
            detail.contains("torchrun --nproc-per-node 8 --numa-binding node"),
            "{detail}"
        );
        // No NUMA node from NVML: bind to the CPUs themselves.
        let (_, detail) = affinity_verdict(
            &gpu(0, Some("0-55"), None),
            0,
            None,
            &TWO_SOCKETS,
            &new_torch,
        );
        assert!(detail.contains("numactl --physcpubind=0-55"), "{detail}");
    }

    #[test]
    fn without_numactl_the_launch_line_binds_cpus_with_taskset_and_says_what_is_missing() {
        let g = gpu(5, Some("56-111,168-223"), Some(1));
        for torch in [None, Some("2.8.0".parse().unwrap())] {
            let launch = Launch {
                torch,
                ranks: 8,
                numactl: false,
                memory_binding: MemoryBind::Unknown,
            };
            let (status, detail) = affinity_verdict(&g, 5, None, &TWO_SOCKETS, &launch);
            assert_eq!(status, Status::Pass);
            assert!(
                detail.contains("taskset -c 56-111,168-223 python train.py (local rank 5)")
                    && detail.contains("and memory to NUMA node 1: add `system: [numactl]`")
                    && !detail.contains("numactl --"),
                "{detail}"
            );
        }
        // torchrun binds by itself: numactl is not needed.
        let launch = Launch {
            torch: Some("2.9.1".parse().unwrap()),
            ranks: 8,
            numactl: false,
            memory_binding: MemoryBind::Unknown,
        };
        let (_, detail) = affinity_verdict(&g, 5, None, &TWO_SOCKETS, &launch);
        assert!(
            detail.contains("--numa-binding node") && !detail.contains("taskset"),
            "{detail}"
        );
    }

    #[test]
    fn a_hidden_topology_is_said_not_guessed() {
        let launch = Launch {
            torch: None,
            ranks: 2,
            numactl: true,
            memory_binding: MemoryBind::Unknown,
        };
        let hidden = |g: &GpuAffinity, nccl: Option<&Affinity>| {
            let (status, detail) = affinity_verdict(g, 0, nccl, &TWO_SOCKETS, &launch);
            assert_eq!(status, Status::Warn, "{detail}");
            assert!(
                !detail.contains("numactl") && !detail.contains("torchrun"),
                "{detail}"
            );
            detail
        };
        assert!(hidden(&gpu(0, Some(""), Some(0)), None).starts_with("topology hidden"));
        assert!(hidden(&gpu(0, None, None), None).contains("Not supported"));
        assert!(hidden(&gpu(0, Some("0-223"), Some(0)), None).contains("every CPU"));
        let log = NcclLog::parse(SHM);
        let detail = hidden(&gpu(0, Some("0-55"), Some(0)), log.affinity.first());
        assert!(
            detail.starts_with("topology hidden") && detail.contains("is empty, ignoring"),
            "{detail}"
        );
        // NCCL knows the GPU's CPUs but the container may not use them: not hidden, but said.
        let fenced = NcclLog::parse(
            "h:1:1 [0] NCCL INFO ncclTopoGetCpuAffinity: Affinity for GPU 0 is empty, ignoring. (GPU affinity = 56-111 ; CPU affinity = 0-15).\n",
        );
        let detail = hidden(&gpu(0, Some("56-111"), Some(1)), fenced.affinity.first());
        assert!(
            detail.contains("none of the CPUs near this GPU (56-111)"),
            "{detail}"
        );
        // On one NUMA node every CPU is near: nothing is hidden and nothing needs binding.
        let one = Machine {
            cpus: Some(32),
            numa_nodes: Some(1),
        };
        let (status, detail) =
            affinity_verdict(&gpu(0, Some("0-31"), Some(0)), 0, None, &one, &launch);
        assert_eq!(status, Status::Pass, "{detail}");
        assert!(detail.contains("no binding is needed"), "{detail}");
    }

    #[test]
    fn affinity_checks_follow_local_rank_order() {
        let gpus = vec![
            gpu(0, Some("0-55"), Some(0)),
            gpu(1, Some("56-111"), Some(1)),
        ];
        let mut report = Report::default();
        let launch = Launch {
            torch: None,
            ranks: 2,
            numactl: true,
            memory_binding: MemoryBind::Refused,
        };
        affinity_checks(&gpus, &[1, 0], None, &TWO_SOCKETS, &launch, &mut report);
        assert_eq!(report.checks.len(), 2);
        assert_eq!(report.checks[0].name, "GPU 1 CPU affinity");
        assert!(report.checks[0].detail.contains("local rank 0"));
        assert!(report.checks.iter().all(|c| c.phase == AFFINITY_PHASE));
        // The launch given is the one each line follows.
        assert!(
            report.checks[0]
                .detail
                .contains("numactl --cpunodebind=1 python train.py"),
            "{}",
            report.checks[0].detail
        );
    }

    #[test]
    fn memory_is_bound_only_where_the_container_allows_it() {
        let cpus = "56-111,168-223";
        let torch_binds: Option<Version> = Some("2.9.1".parse().unwrap());
        let torch_without: Option<Version> = Some("2.8.0".parse().unwrap());
        for (torch, numactl) in [
            (torch_binds.clone(), true),
            (torch_binds.clone(), false),
            (torch_without.clone(), true),
            (torch_without.clone(), false),
            (None, true),
            (None, false),
        ] {
            for memory_binding in [
                MemoryBind::Allowed,
                MemoryBind::Refused,
                MemoryBind::Unknown,
            ] {
                for node in [Some(1), None] {
                    let launch = Launch {
                        torch: torch.clone(),
                        ranks: 8,
                        numactl,
                        memory_binding,
                    };
                    let line = launch_line(&launch, 5, node, cpus);
                    let case = format!(
                        "{torch:?} numactl={numactl} {memory_binding:?} node={node:?}: {line}"
                    );
                    let torchrun = node.is_some() && torch == torch_binds;
                    let refused_here = memory_binding == MemoryBind::Refused;
                    if torchrun {
                        // torchrun binds CPUs alone: whatever memory binding may do.
                        assert_eq!(
                            line, "torchrun --nproc-per-node 8 --numa-binding node train.py",
                            "{case}"
                        );
                        continue;
                    }
                    assert!(line.contains("(local rank 5)"), "{case}");
                    // `--membind` is given only where it would not fail.
                    assert_eq!(
                        line.contains("--membind=1 python"),
                        numactl && node.is_some() && !refused_here,
                        "{case}"
                    );
                    // Where it is left out for the refusal, the line says what it needs.
                    let says_why = line.contains("`--membind=1` needs CAP_SYS_NICE")
                        && line.contains("--cap-add SYS_NICE");
                    assert_eq!(says_why, node.is_some() && refused_here, "{case}");
                    match (numactl, node) {
                        (true, Some(_)) => {
                            assert!(line.starts_with("numactl --cpunodebind=1 "), "{case}")
                        }
                        (true, None) => {
                            assert!(
                                line.starts_with(
                                    "numactl --physcpubind=56-111,168-223 python train.py"
                                ),
                                "{case}"
                            );
                            assert!(!line.contains("membind"), "{case}");
                        }
                        (false, _) => {
                            assert!(
                                line.starts_with("taskset -c 56-111,168-223 python train.py"),
                                "{case}"
                            );
                            assert!(line.contains("add `system: [numactl]`"), "{case}");
                            assert_eq!(
                                line.contains("and memory to NUMA node 1"),
                                node.is_some() && !refused_here,
                                "{case}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_checks_of_a_logged_run_land_in_the_report() {
        let log = NcclLog::parse(SHM);
        let mut report = Report::default();
        let preset = preset(&[("NCCL_P2P_DISABLE", "1"), ("NCCL_P2P_LEVEL", "NVL")]);
        nccl_checks(
            &log,
            &preset,
            expects_nvlink(&preset, &[]).as_deref(),
            table(),
            &mut report,
        );
        let status_of = |name: &str| {
            report
                .checks
                .iter()
                .find(|c| c.name == name)
                .map(|c| c.status)
        };
        assert_eq!(status_of("NCCL_P2P_DISABLE"), Some(Status::Pass));
        // NCCL_P2P_DISABLE=1 wins over the level, which NCCL then never reads.
        let level = report
            .checks
            .iter()
            .find(|c| c.name == "NCCL_P2P_LEVEL")
            .unwrap();
        assert_eq!(level.status, Status::Warn);
        assert!(
            level.detail.contains("NCCL_P2P_DISABLE=1 turns P2P off"),
            "{}",
            level.detail
        );
        assert_eq!(status_of("transports"), Some(Status::Fail));
        assert_eq!(status_of("algorithm per size"), Some(Status::Pass));
        assert!(report.checks.iter().all(|c| c.phase == PHASE));
        assert_eq!(report.exit_code(), 1);
    }
}
