//! NCCL's own account of a run, read back from its INFO log (`NCCL_DEBUG=INFO`): the
//! variables it applied or refused, the transport each channel took between two GPUs, the
//! channels it built, the algorithm and protocol it picked per collective and size, and the
//! CPUs it bound to. The formats are NCCL 2.28's, cited per kind of line; a line of any other
//! shape is skipped, so a NCCL that rewords one message loses that one fact, not the parse.
//!
//! Every line NCCL writes starts `HOST:PID:TID [CUDADEV] NCCL INFO ` or, for warnings,
//! `HOST:PID:TID [CUDADEV] FILE:LINE NCCL WARN `, optionally after a timestamp
//! (src/debug.cc, ncclDebugLog); the message after that marker is what is parsed here.

use serde::Serialize;

/// Everything the log told, each fact once however many ranks or communicators repeated it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NcclLog {
    /// `2.28.9+cuda12.9`, from `NCCL version ...` (src/init.cc, showVersion).
    pub version: Option<String>,
    /// Variables NCCL says it took from the environment, with the value as NCCL printed it.
    pub applied: Vec<Applied>,
    /// Values NCCL refused, in its own words.
    pub rejected: Vec<Rejected>,
    /// Per pair of GPUs and transport, the channels that took it.
    pub links: Vec<Link>,
    /// Channel counts, once per distinct set (each communicator and rank prints its own).
    pub channels: Vec<ChannelCounts>,
    /// The algorithm and protocol per collective and message size.
    pub choices: Vec<Choice>,
    /// The CPUs NCCL bound each GPU's threads to.
    pub affinity: Vec<Affinity>,
    /// NCCL's warnings, verbatim.
    pub warnings: Vec<String>,
    /// The network plugin NCCL chose, `Socket` or `IB` (`Using network IB`, src/net.cc).
    pub network: Option<String>,
    /// What NCCL said of its IB transport, verbatim and in order: whether it could open
    /// libibverbs (`Failed to open libibverbs.so[.1]`, src/misc/ibvsymbols.cc), the devices it
    /// found (`NET/IB : No device found.`, `NET/IB : Using [0]mlx5_0:1/RoCE ...`,
    /// src/transport/net_ib) and whether the plugin came up (`Failed to initialize NET plugin
    /// IB`, src/plugin/net.cc).
    pub ib: Vec<String>,
    /// The graphs NCCL's topology search settled on (logged under GRAPH).
    pub graphs: Vec<Graph>,
}

/// One graph of NCCL's topology search: `Pattern 4, crossNic 0, nChannels 24, bw 40.000000/
/// 40.000000, type NVL/PIX, sameChannels 1` (src/graph/search.cc, ncclTopoPrintGraph).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Graph {
    /// NCCL's pattern number (ring, tree, ...).
    pub pattern: u32,
    /// Channels.
    pub channels: u32,
    /// The path type between GPUs of a node: `NVL` (NVLink), `NVB` (NVLink through a GPU),
    /// `PIX`, `PXB`, `PHB`, `SYS` (PCIe and beyond), `LOC` (one GPU: no path).
    pub intra: String,
    /// The path type to the network: `PIX`, ..., `NET`, `LOC` when there is no other node.
    pub inter: String,
}

/// A variable NCCL took from the environment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Applied {
    /// `NCCL_P2P_LEVEL`.
    pub name: String,
    /// The value as NCCL printed it: the integer it parsed for numeric parameters, the
    /// level's name for NCCL_P2P_LEVEL, the text itself for others.
    pub value: String,
}

/// A value NCCL refused.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rejected {
    /// The variable, where NCCL names it.
    pub name: Option<String>,
    /// The refused value, where NCCL quotes it; how an unnamed refusal is matched to a variable.
    pub value: Option<String>,
    /// NCCL's sentence.
    pub words: String,
}

/// The channels from one GPU to another that took one transport.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Link {
    /// The sending rank in its communicator.
    pub from_rank: u32,
    /// The receiving rank.
    pub to_rank: u32,
    /// The sending GPU's NVML index (NCCL prints `rank[nvmlDev]`).
    pub from_gpu: u32,
    /// The receiving GPU's NVML index.
    pub to_gpu: u32,
    /// What NCCL printed after `via`: `P2P/CUMEM/read`, `SHM/direct/direct`, `NET/Socket/0`.
    pub via: String,
    /// The channel numbers, ascending.
    pub channels: Vec<u32>,
}

/// The kind of transport a link took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// GPU to GPU directly: NVLink or PCIe peer access (src/transport/p2p.cc).
    P2p,
    /// Through host shared memory (src/transport/shm.cc).
    Shm,
    /// Through the network stack, sockets or InfiniBand (src/transport/net.cc).
    Net,
    /// Anything else.
    Other,
}

impl Link {
    /// The kind of transport, from the first word after `via`.
    pub fn transport(&self) -> LinkKind {
        match self.via.split('/').next() {
            Some("P2P") => LinkKind::P2p,
            Some("SHM") => LinkKind::Shm,
            Some("NET") => LinkKind::Net,
            _ => LinkKind::Other,
        }
    }
}

/// The channels one communicator built (src/init.cc, initTransportsRank).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChannelCounts {
    /// Channels for collectives (rings and trees).
    pub coll: u32,
    /// NVLink SHARP channels; 0 while the probe keeps NCCL_NVLS_ENABLE=0.
    pub nvls: u32,
    /// Channels for point-to-point operations.
    pub p2p: u32,
    /// Of those, per peer.
    pub p2p_per_peer: u32,
}

/// What NCCL picked for one collective call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Choice {
    /// `AllReduce`.
    pub collective: String,
    /// Message bytes.
    pub bytes: u64,
    /// `RING`, `TREE`, `NVLS`, ...
    pub algorithm: String,
    /// `LL`, `LL128` or `SIMPLE`.
    pub protocol: String,
}

/// The CPUs NCCL bound one GPU's threads to (src/graph/topo.cc, ncclTopoGetCpuAffinity).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Affinity {
    /// The GPU's NVML index.
    pub gpu: u32,
    /// The CPUs (`0-55,112-167`); None when NCCL found none it may use near the GPU.
    pub cpus: Option<String>,
    /// The CPUs NCCL's topology puts near the GPU, where it says (2.28 and later); an
    /// empty string when it knows none.
    pub gpu_cpus: Option<String>,
    /// The CPUs the process may run on, where NCCL says.
    pub process_cpus: Option<String>,
    /// NCCL's sentence.
    pub words: String,
}

impl NcclLog {
    /// Reads every line of `text`, ignoring those it does not recognise.
    pub fn parse(text: &str) -> NcclLog {
        let mut log = NcclLog::default();
        for line in text.lines() {
            if let Some((level, message)) = message_of(line) {
                log.read(level, message.trim_end());
            }
        }
        log.links.sort_by(|a, b| {
            (a.from_gpu, a.to_gpu, a.from_rank, a.to_rank, &a.via).cmp(&(
                b.from_gpu,
                b.to_gpu,
                b.from_rank,
                b.to_rank,
                &b.via,
            ))
        });
        log.choices.sort_by(|a, b| {
            (&a.collective, a.bytes, &a.algorithm, &a.protocol).cmp(&(
                &b.collective,
                b.bytes,
                &b.algorithm,
                &b.protocol,
            ))
        });
        log.affinity.sort_by_key(|a| a.gpu);
        log
    }

    fn read(&mut self, level: Level, message: &str) {
        if level == Level::Warn {
            push_new(&mut self.warnings, message.trim().to_string());
        }
        if let Some(rest) = message.strip_prefix("NCCL version ") {
            self.version = rest.split_whitespace().next().map(String::from);
        } else if let Some(applied) = applied(message) {
            push_new(&mut self.applied, applied);
        } else if let Some(rejected) = rejected(message) {
            push_new(&mut self.rejected, rejected);
        } else if let Some((channel, from, to, via)) = connection(message) {
            self.add_link(channel, from, to, via);
        } else if let Some(network) = message.strip_prefix("Using network ") {
            self.network = Some(network.trim().to_string());
        } else if is_about_ib(message) {
            push_new(&mut self.ib, message.trim().to_string());
        } else if let Some(graph) = graph(message) {
            push_new(&mut self.graphs, graph);
        } else if let Some(counts) = channel_counts(message) {
            push_new(&mut self.channels, counts);
        } else if let Some(choice) = choice(message) {
            push_new(&mut self.choices, choice);
        } else if let Some(affinity) = affinity(message) {
            push_new(&mut self.affinity, affinity);
        }
    }

    fn add_link(&mut self, channel: u32, from: Peer, to: Peer, via: &str) {
        let ((from_rank, from_gpu), (to_rank, to_gpu)) = (from, to);
        let found = self.links.iter_mut().find(|l| {
            (l.from_rank, l.from_gpu, l.to_rank, l.to_gpu) == (from_rank, from_gpu, to_rank, to_gpu)
                && l.via == via
        });
        let link = match found {
            Some(link) => link,
            None => {
                self.links.push(Link {
                    from_rank,
                    to_rank,
                    from_gpu,
                    to_gpu,
                    via: via.to_string(),
                    channels: Vec::new(),
                });
                self.links.last_mut().expect("just pushed")
            }
        };
        if let Err(at) = link.channels.binary_search(&channel) {
            link.channels.insert(at, channel);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Info,
    Warn,
}

/// The message of one line, after NCCL's prefix; None for lines that are not NCCL's.
fn message_of(line: &str) -> Option<(Level, &str)> {
    const INFO: &str = "NCCL INFO ";
    const WARN: &str = "NCCL WARN ";
    if let Some(at) = line.find(INFO) {
        return Some((Level::Info, &line[at + INFO.len()..]));
    }
    if let Some(at) = line.find(WARN) {
        return Some((Level::Warn, &line[at + WARN.len()..]));
    }
    // With NCCL_DEBUG=VERSION or WARN the version line has no prefix (src/init.cc, showVersion).
    line.find("NCCL version ")
        .map(|at| (Level::Info, &line[at..]))
}

fn push_new<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// Whether `word` looks like one of NCCL's variables.
fn is_variable(word: &str) -> bool {
    word.len() > "NCCL_".len()
        && word.starts_with("NCCL_")
        && word
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// The NCCL_* names a message mentions, in order.
fn variables_in(message: &str) -> impl Iterator<Item = &str> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| is_variable(w))
}

/// `NAME set by environment to VALUE`: src/misc/param.cc (ncclLoadParam, integer parameters,
/// printed as `%lld.`), src/graph/paths.cc (ncclGetLevel: NCCL_P2P_DISABLE as `%d`,
/// NCCL_P2P_LEVEL and NCCL_NET_GDR_LEVEL as the level's name), src/graph/tuning.cc
/// (NCCL_ALGO, NCCL_PROTO as given), src/init.cc (NCCL_COLLNET_ENABLE as `%d.`), and others.
fn applied(message: &str) -> Option<Applied> {
    let (name, value) = message.split_once(" set by environment to ")?;
    if !is_variable(name) {
        return None;
    }
    // The period param.cc puts after an integer is punctuation, not part of the value.
    let value = match value.strip_suffix('.') {
        Some(number) if number.parse::<i64>().is_ok() => number,
        _ => value,
    };
    Some(Applied {
        name: name.to_string(),
        value: value.to_string(),
    })
}

/// A refusal, in one of the shapes NCCL 2.28 words them:
/// - `Invalid value V for NAME, using default D.` (src/misc/param.cc, ncclLoadParam: strtoll
///   overflowed);
/// - `Unrecognized element token "E" when parsing "V"`, `Unrecognized prefix token ...`, `All
///   entries except the first must have a prefix: "V"` (src/graph/tuning.cc, parseList, for
///   NCCL_ALGO and NCCL_PROTO), which quote the value but not the variable;
/// - a variable named beside a word of refusal: `Invalid NCCL_NTHREADS 100 (must be a
///   multiple of 32)` (tuning.cc, getNthreads), `NCCL_WORK_FIFO_BYTES=... is being ignored`
///   (init.cc), `NCCL_SOCKET_NTHREADS is greater than the maximum allowed` (net_socket.cc).
fn rejected(message: &str) -> Option<Rejected> {
    let words = message.trim().to_string();
    if let Some(rest) = message.strip_prefix("Invalid value ")
        && let Some((value, tail)) = rest.rsplit_once(" for ")
    {
        let name = tail.split(',').next().unwrap_or("");
        if is_variable(name) {
            return Some(Rejected {
                name: Some(name.to_string()),
                value: Some(value.to_string()),
                words,
            });
        }
    }
    if message.starts_with("Unrecognized ") && message.contains(" when parsing ")
        || message.starts_with("All entries except the first must have a prefix")
    {
        return Some(Rejected {
            name: None,
            value: last_quoted(message).map(String::from),
            words,
        });
    }
    let lower = message.to_ascii_lowercase();
    let refuses = ["invalid", "ignored", "greater than the maximum"]
        .iter()
        .any(|w| lower.contains(w));
    if refuses && let Some(name) = variables_in(message).next() {
        return Some(Rejected {
            name: Some(name.to_string()),
            value: None,
            words,
        });
    }
    None
}

/// The last `"..."` in a message.
fn last_quoted(message: &str) -> Option<&str> {
    let end = message.rfind('"')?;
    let start = message[..end].rfind('"')?;
    Some(&message[start + 1..end])
}

/// One channel's connection to a peer: (channel, from GPU, to GPU, what follows `via`).
/// - `Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`, `.../direct pointer`, `.../IPC`,
///   `.../indirect/2[2]` (src/transport/p2p.cc, p2pSendSetup);
/// - `Channel 00 : 0[0] -> 1[1] via SHM/direct/direct` (src/transport/shm.cc, shmSendSetup);
/// - `Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0`, and `[receive]` with the ranks
///   still in sending order (src/transport/net.cc, sendSetup and recvSetup).
///
/// The ring order lines `Channel 00/02 : 0 1` (src/graph/rings.cc) have no `via`.
fn connection(message: &str) -> Option<(u32, Peer, Peer, &str)> {
    let rest = message.strip_prefix("Channel ")?;
    let (channel, rest) = rest.split_once(" : ")?;
    let channel: u32 = channel.split('/').next()?.trim().parse().ok()?;
    let (peers, via) = rest.split_once(" via ")?;
    let peers = peers
        .trim_end()
        .trim_end_matches("[send]")
        .trim_end_matches("[receive]")
        .trim_end();
    let (from, to) = peers.split_once(" -> ")?;
    Some((channel, peer_of(from)?, peer_of(to)?, via.trim()))
}

/// A rank and its GPU's NVML index.
type Peer = (u32, u32);

/// `RANK[NVMLDEV]`.
fn peer_of(peer: &str) -> Option<Peer> {
    let (rank, dev) = peer.trim().split_once('[')?;
    Some((rank.parse().ok()?, dev.strip_suffix(']')?.parse().ok()?))
}

/// `Pattern 4, crossNic 0, nChannels 24, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1`.
fn graph(message: &str) -> Option<Graph> {
    let rest = message.strip_prefix("Pattern ")?;
    let field = |name: &str| {
        rest.split(", ")
            .find_map(|part| part.strip_prefix(name))
            .map(str::trim)
    };
    let pattern = rest.split(',').next()?.trim().parse().ok()?;
    let channels = field("nChannels ")?.parse().ok()?;
    let (intra, inter) = field("type ")?.split_once('/')?;
    Some(Graph {
        pattern,
        channels,
        intra: intra.to_string(),
        inter: inter.to_string(),
    })
}

/// `16 coll channels, 16 collnet channels, 0 nvls channels, 32 p2p channels, 2 p2p channels
/// per peer` (src/init.cc, initTransportsRank).
fn channel_counts(message: &str) -> Option<ChannelCounts> {
    if !message.contains(" coll channels, ") {
        return None;
    }
    let mut counts = ChannelCounts {
        coll: 0,
        nvls: 0,
        p2p: 0,
        p2p_per_peer: 0,
    };
    for part in message.split(", ") {
        let (number, label) = part.trim().split_once(' ')?;
        let number: u32 = number.parse().ok()?;
        match label {
            "coll channels" => counts.coll = number,
            "nvls channels" => counts.nvls = number,
            "p2p channels" => counts.p2p = number,
            "p2p channels per peer" => counts.p2p_per_peer = number,
            _ => {}
        }
    }
    Some(counts)
}

/// `AllReduce: 1048576 Bytes -> Algo RING proto LL128 channel{Lo..Hi}={0..15}` (src/enqueue.cc,
/// scheduleCollTasksToPlan, NCCL_DEBUG_SUBSYS=TUNING, rank 0 only, once per call). NCCL 2.23
/// to 2.25 printed the algorithm and protocol as numbers (`Algo 1 proto 2 time 12.5`).
fn choice(message: &str) -> Option<Choice> {
    let (collective, rest) = message.split_once(": ")?;
    if collective.is_empty() || !collective.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let (bytes, rest) = rest.split_once(" Bytes -> Algo ")?;
    let mut words = rest.split_whitespace();
    let algorithm = words.next()?;
    if words.next()? != "proto" {
        return None;
    }
    let protocol = words.next()?;
    Some(Choice {
        collective: collective.to_string(),
        bytes: bytes.trim().parse().ok()?,
        algorithm: named(algorithm, ALGORITHMS),
        protocol: named(protocol, PROTOCOLS),
    })
}

/// NCCL_ALGO_* and NCCL_PROTO_* by number, stable since 2.23 (src/include/nccl_common.h,
/// later src/include/plugin/nccl_tuner.h).
const ALGORITHMS: &[&str] = &[
    "TREE",
    "RING",
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS",
    "NVLS_TREE",
    "PAT",
];
const PROTOCOLS: &[&str] = &["LL", "LL128", "SIMPLE"];

/// The name for a number NCCL printed, or the word as printed.
fn named(word: &str, names: &[&str]) -> String {
    match word.parse::<usize>().ok().and_then(|i| names.get(i)) {
        Some(name) => name.to_string(),
        None => word.to_string(),
    }
}

/// - 2.28: `ncclTopoGetCpuAffinity: Affinity for GPU 0 is 0-55,112-167. (GPU affinity =
///   0-55,112-167 ; CPU affinity = 0-223).`, or `... is empty, ignoring. (GPU affinity =  ;
///   CPU affinity = 0-15).` when the process may use none of the GPU's CPUs
///   (src/graph/topo.cc, ncclTopoGetCpuAffinity; the CPU lists from ncclCpusetToRangeStr);
/// - before: `Setting affinity for GPU 0 to 0-55,112-167`, and nothing when it was empty.
fn affinity(message: &str) -> Option<Affinity> {
    let words = message.trim().to_string();
    if let Some((_, rest)) = message.split_once("Setting affinity for GPU ") {
        let (gpu, cpus) = rest.split_once(" to ")?;
        return Some(Affinity {
            gpu: gpu.trim().parse().ok()?,
            cpus: Some(cpus.trim().to_string()),
            gpu_cpus: None,
            process_cpus: None,
            words,
        });
    }
    let (_, rest) = message.split_once("Affinity for GPU ")?;
    let (gpu, rest) = rest.split_once(" is ")?;
    let (chosen, details) = match rest.split_once(". (") {
        Some((chosen, details)) => (chosen, Some(details)),
        None => (rest.trim_end_matches('.'), None),
    };
    let cpus = (!chosen.starts_with("empty")).then(|| chosen.trim().to_string());
    let between = |start: &str, ends: &[&str]| -> Option<String> {
        let (_, after) = details?.split_once(start)?;
        let end = ends
            .iter()
            .filter_map(|e| after.find(e))
            .min()
            .unwrap_or(after.len());
        Some(after[..end].trim().to_string())
    };
    Some(Affinity {
        gpu: gpu.trim().parse().ok()?,
        cpus,
        gpu_cpus: between("GPU affinity =", &[" ; ", ")"]),
        process_cpus: between("CPU affinity =", &[")"]),
        words,
    })
}

/// CPU or channel numbers as NCCL and Linux write them: `0-55,112-167`
/// (src/include/cpuset.h, ncclCpusetToRangeStr). Expects them ascending.
pub fn ranges(numbers: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let start = numbers[i];
        let mut end = start;
        while i + 1 < numbers.len() && numbers[i + 1] == end + 1 {
            i += 1;
            end = numbers[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// The numbers in `0-55,112-167`, ascending; None when the text is not such a list. An
/// empty text is an empty list.
pub fn parse_ranges(text: &str) -> Option<Vec<u32>> {
    let mut numbers = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.trim().is_empty()) {
        let (start, end) = match part.split_once('-') {
            Some((start, end)) => (start.trim().parse().ok()?, end.trim().parse().ok()?),
            None => {
                let n: u32 = part.trim().parse().ok()?;
                (n, n)
            }
        };
        if end < start {
            return None;
        }
        numbers.extend(start..=end);
    }
    numbers.sort_unstable();
    numbers.dedup();
    Some(numbers)
}

/// Whether a message is NCCL's about its IB transport: the `NET/IB` lines, the attempt to
/// open libibverbs, and the IB plugin's start.
fn is_about_ib(message: &str) -> bool {
    message.starts_with("NET/IB ")
        || message.contains("libibverbs")
        || message.ends_with("NET plugin IB")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each link as (from GPU, to GPU, transport, channel ranges).
    fn link_summary(log: &NcclLog) -> Vec<(u32, u32, &str, String)> {
        log.links
            .iter()
            .map(|l| (l.from_gpu, l.to_gpu, l.via.as_str(), ranges(&l.channels)))
            .collect()
    }

    const CUMEM: &str = include_str!("../../tests/fixtures/nccl-logs/p2p-cumem-2.28.log");
    const SHM: &str = include_str!("../../tests/fixtures/nccl-logs/shm-hidden-affinity-2.28.log");
    const SOCKET: &str = include_str!("../../tests/fixtures/nccl-logs/net-socket-2.28.log");

    fn applied(name: &str, value: &str) -> Applied {
        Applied {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn variables_are_read_as_nccl_printed_them() {
        let log = NcclLog::parse(CUMEM);
        assert_eq!(log.version.as_deref(), Some("2.28.9+cuda12.9"));
        assert_eq!(
            log.applied,
            vec![
                applied("NCCL_CUMEM_ENABLE", "1"),
                applied("NCCL_BUFFSIZE", "8"),
                applied("NCCL_P2P_LEVEL", "NVL"),
            ],
            "each variable once although both ranks print it"
        );
        assert_eq!(
            log.rejected,
            vec![Rejected {
                name: Some("NCCL_MIN_NCHANNELS".into()),
                value: Some("99999999999999999999".into()),
                words:
                    "Invalid value 99999999999999999999 for NCCL_MIN_NCHANNELS, using default -2."
                        .into(),
            }]
        );
    }

    #[test]
    fn p2p_channels_are_grouped_per_pair_and_transport() {
        let log = NcclLog::parse(CUMEM);
        assert_eq!(
            link_summary(&log),
            vec![
                (0, 1, "P2P/CUMEM/read", "0-3".to_string()),
                (1, 0, "P2P/CUMEM/read", "0-3".to_string()),
            ]
        );
        assert!(log.links.iter().all(|l| l.transport() == LinkKind::P2p));
        assert_eq!(
            log.channels,
            vec![ChannelCounts {
                coll: 4,
                nvls: 0,
                p2p: 8,
                p2p_per_peer: 2
            }]
        );
        // The ring order (`Channel 00/04 : 0 1`) is not a connection.
        assert!(log.links.iter().all(|l| !l.channels.is_empty()));
    }

    #[test]
    fn algorithm_and_protocol_per_size_come_from_tuning_lines() {
        let log = NcclLog::parse(CUMEM);
        let choices: Vec<(u64, &str, &str)> = log
            .choices
            .iter()
            .map(|c| (c.bytes, c.algorithm.as_str(), c.protocol.as_str()))
            .collect();
        assert_eq!(
            choices,
            vec![
                (1024, "RING", "LL"),
                (1048576, "RING", "LL128"),
                (268435456, "RING", "SIMPLE"),
            ]
        );
        assert!(log.choices.iter().all(|c| c.collective == "AllReduce"));
        // 2.23-2.25 printed numbers.
        let old = NcclLog::parse(
            "h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 0 proto 2 time 14.200000\n",
        );
        assert_eq!(
            (
                old.choices[0].algorithm.as_str(),
                old.choices[0].protocol.as_str()
            ),
            ("TREE", "SIMPLE")
        );
    }

    #[test]
    fn shm_channels_and_an_empty_affinity_are_recognised() {
        let log = NcclLog::parse(SHM);
        assert_eq!(log.applied, vec![applied("NCCL_P2P_DISABLE", "1")]);
        assert_eq!(log.links.len(), 2);
        assert!(
            log.links
                .iter()
                .all(|l| l.transport() == LinkKind::Shm && l.via == "SHM/direct/direct")
        );
        assert_eq!(ranges(&log.links[0].channels), "0-1");
        assert_eq!(log.affinity.len(), 2);
        let gpu0 = &log.affinity[0];
        assert_eq!(gpu0.gpu, 0);
        assert_eq!(gpu0.cpus, None);
        assert_eq!(gpu0.gpu_cpus.as_deref(), Some(""));
        assert_eq!(gpu0.process_cpus.as_deref(), Some("0-15"));
        assert!(gpu0.words.contains("is empty, ignoring"), "{}", gpu0.words);
    }

    #[test]
    fn links_keep_their_ranks_and_the_network_and_graphs_are_read() {
        let log = NcclLog::parse(SOCKET);
        let ranks: Vec<(u32, u32)> = log.links.iter().map(|l| (l.from_rank, l.to_rank)).collect();
        assert_eq!(ranks, vec![(0, 1), (1, 0)]);
        assert_eq!(log.network.as_deref(), Some("Socket"));
        // Two processes, one GPU each, ranks 2 and 5 of a communicator: the GPU index alone
        // would merge them; the rank keeps them apart.
        let log = NcclLog::parse(concat!(
            "a:1:1 [0] NCCL INFO Channel 00/0 : 2[0] -> 5[0] [send] via NET/IB/0\n",
            "a:1:1 [0] NCCL INFO Channel 01/0 : 2[0] -> 5[0] [send] via NET/IB/0\n",
            "b:2:2 [0] NCCL INFO Channel 00/0 : 5[0] -> 2[0] [send] via NET/IB/0\n",
            "a:1:1 [0] NCCL INFO Pattern 4, crossNic 0, nChannels 2, bw 20.000000/20.000000, type LOC/PHB, sameChannels 1\n",
            "a:1:1 [0] NCCL INFO Pattern 3, crossNic 0, nChannels 24, bw 40.0/40.0, type NVL/PIX, sameChannels 1\n",
            "a:1:1 [0] NCCL INFO Pattern x, nonsense\n",
        ));
        let links: Vec<(u32, u32, &str, String)> = log
            .links
            .iter()
            .map(|l| (l.from_rank, l.to_rank, l.via.as_str(), ranges(&l.channels)))
            .collect();
        assert_eq!(
            links,
            vec![
                (2, 5, "NET/IB/0", "0-1".to_string()),
                (5, 2, "NET/IB/0", "0".to_string())
            ]
        );
        let graphs: Vec<(u32, u32, &str, &str)> = log
            .graphs
            .iter()
            .map(|g| (g.pattern, g.channels, g.intra.as_str(), g.inter.as_str()))
            .collect();
        assert_eq!(graphs, vec![(4, 2, "LOC", "PHB"), (3, 24, "NVL", "PIX")]);
    }

    #[test]
    fn network_channels_count_once_from_sender_and_receiver() {
        let log = NcclLog::parse(SOCKET);
        assert_eq!(
            log.applied,
            vec![
                applied("NCCL_SHM_DISABLE", "1"),
                applied("NCCL_P2P_DISABLE", "1")
            ]
        );
        let pairs: Vec<(u32, u32, &str)> = log
            .links
            .iter()
            .map(|l| (l.from_gpu, l.to_gpu, l.via.as_str()))
            .collect();
        assert_eq!(pairs, vec![(0, 1, "NET/Socket/0"), (1, 0, "NET/Socket/0")]);
        assert!(log.links.iter().all(|l| l.transport() == LinkKind::Net));
        assert!(log.warnings.is_empty(), "{:?}", log.warnings);
        let gpu1 = &log.affinity[1];
        assert_eq!(gpu1.cpus.as_deref(), Some("56-111,168-223"));
        assert_eq!(gpu1.gpu_cpus.as_deref(), Some("56-111,168-223"));
        assert_eq!(gpu1.process_cpus.as_deref(), Some("0-223"));
    }

    #[test]
    fn refusals_that_quote_only_the_value_keep_the_value() {
        let log = NcclLog::parse(concat!(
            "\n",
            "[2025-11-02 10:00:01] node:7:7 [0] graph/tuning.cc:104 NCCL WARN Unrecognized element token \"tre\" when parsing \"ring,tre\"\n",
            "node:7:7 [0] NCCL INFO Invalid NCCL_NTHREADS 100 (must be a multiple of 32)\n",
            "node:7:7 [0] init.cc:539 NCCL WARN NCCL_WORK_FIFO_BYTES=1000 is being ignored because it is not a power of 2.\n",
            "node:7:7 [0] mnnvl.cc:67 NCCL WARN MNNVL (cliqueSize 4) is available but not working on this system. Set NCCL_MNNVL_ENABLE=0 to ignore this issue.\n",
        ));
        let rejected: Vec<(Option<&str>, Option<&str>)> = log
            .rejected
            .iter()
            .map(|r| (r.name.as_deref(), r.value.as_deref()))
            .collect();
        assert_eq!(
            rejected,
            vec![
                (None, Some("ring,tre")),
                (Some("NCCL_NTHREADS"), None),
                (Some("NCCL_WORK_FIFO_BYTES"), None),
            ],
            "advice to set a variable is not a refusal of it"
        );
        assert_eq!(log.warnings.len(), 3);
    }

    #[test]
    fn a_recorded_probe_like_run_on_two_h200s_reads_whole() {
        // ncclCommInitAll in one process, as the probe's worker runs NCCL: NCCL 2.28.9 from
        // PyTorch 2.11's wheel, NCCL_P2P_LEVEL=NVL, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING.
        let log = NcclLog::parse(include_str!(
            "../../tests/fixtures/nccl-logs/h200x2-comm-init-all-2.28.9.log"
        ));
        assert_eq!(log.version.as_deref(), Some("2.28.9+cuda13.0"));
        assert_eq!(
            log.applied,
            vec![
                applied("NCCL_P2P_LEVEL", "NVL"),
                applied("NCCL_NVLS_ENABLE", "0")
            ]
        );
        assert!(log.rejected.is_empty() && log.warnings.is_empty());
        assert_eq!(
            link_summary(&log),
            vec![
                (0, 1, "P2P/direct pointer", "0-23".to_string()),
                (1, 0, "P2P/direct pointer", "0-23".to_string()),
            ]
        );
        assert_eq!(log.channels.len(), 1);
        assert_eq!(log.channels[0].coll, 24);
        let sizes: Vec<(u64, &str)> = log
            .choices
            .iter()
            .map(|c| (c.bytes, c.protocol.as_str()))
            .collect();
        assert_eq!(
            sizes,
            vec![(1024, "LL"), (1048576, "LL"), (268435456, "SIMPLE")]
        );
        // That VM hides its topology from NCCL.
        assert!(log.affinity.iter().all(|a| a.cpus.is_none()));
        assert_eq!(log.affinity.len(), 2);
    }

    #[test]
    fn odd_lines_are_skipped_without_harm() {
        let text = concat!(
            "garbage\n",
            "NCCL INFO\n",
            "h:1:1 [0] NCCL INFO Channel xx/0 : 0[0] -> 1[1] via P2P/IPC\n",
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> [1] via P2P/IPC\n",
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0 1\n",
            "h:1:1 [0] NCCL INFO Affinity for GPU x is 0-3.\n",
            "h:1:1 [0] NCCL INFO AllReduce: many Bytes -> Algo RING proto LL\n",
            "h:1:1 [0] NCCL INFO lower_case set by environment to 3\n",
            "h:1:1 [0] NCCL INFO 4 coll channels, lots\n",
            "h:1:1 [0] NCCL INFO ¿ünïcödé? Channel 00 : 0[0] -> 1[1] via\n",
        );
        assert_eq!(NcclLog::parse(text), NcclLog::default());
    }

    #[test]
    fn ranges_round_trip() {
        assert_eq!(ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(ranges(&[]), "");
        assert_eq!(
            parse_ranges("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_ranges(""), Some(vec![]));
        assert_eq!(parse_ranges("3-1"), None);
        assert_eq!(parse_ranges("a-b"), None);
    }
}
