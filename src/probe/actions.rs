//! What a fleet does about a failed check: none, rerun, fix-config, reset-gpu, reboot or
//! drain-and-replace, with the upstream document behind it. data/actions.yaml holds the
//! failure classes and the rules that put a check in one by its phase, its name and the words
//! of its detail; [`advise`] attaches the chosen class to every FAIL check of a report (and to
//! the WARN checks a rule names) as the check's advice.
//!
//! The most specific rule wins (one that reads the detail, then one that reads the name, then
//! the phase), then the most severe action, then the rule written first; the header of
//! data/actions.yaml says why. A FAIL check no rule knows is `unclassified` (rerun).

use super::report::Report;
use crate::verdict::{Action, Advice, Check, Status};
use serde::Deserialize;
use serde_json::Value;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::OnceLock;

const ACTIONS_YAML: &str = include_str!("../../data/actions.yaml");

/// The class of a FAIL check that no rule knows.
pub const UNCLASSIFIED: &str = "unclassified";

/// The class of a detail that names an Xid the table has no row for.
const XID_OTHER: &str = "xid_other";

/// data/actions.yaml as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    /// The documents many rows cite, by name (the file's YAML anchors).
    pub sources: BTreeMap<String, String>,
    /// The failure classes.
    pub actions: Vec<Row>,
    /// Which checks fall in which class.
    pub rules: Vec<Rule>,
}

/// One failure class: its action and the source that supports it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// The class's name.
    pub class: String,
    /// What to do.
    pub action: Action,
    /// The source's URL, or `judgement`.
    pub source: String,
    /// The heading in the source; `n/a` for a judgement.
    pub section: String,
    /// What the source says, in a line of our own words.
    pub why: String,
    /// The Xid the row is for.
    #[serde(default)]
    pub xid: Option<u32>,
    /// The Xid catalog's description, paraphrased.
    #[serde(default)]
    pub meaning: Option<String>,
    /// What a judgement leaned on, or further references.
    #[serde(default)]
    pub see: Vec<String>,
    /// Anything else a reader should know.
    #[serde(default)]
    pub note: Option<String>,
    /// What to do when the failure comes back after the action.
    #[serde(default)]
    pub escalate: Option<String>,
    /// For `fix-config`: the action of a fleet that knows only the other five.
    #[serde(default)]
    pub fallback: Option<Action>,
    /// The row stands for other checks' advice.
    #[serde(default)]
    pub rollup: Option<Rollup>,
}

/// Whose advice a roll-up row takes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rollup {
    /// The worst advice in the report of the rank the check names (`rank N`).
    Rank,
    /// The worst advice among the report's other checks.
    Report,
}

/// One rule: the checks it applies to and their class.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The check's phase; any when absent.
    #[serde(default)]
    pub phase: Option<String>,
    /// The check's name: `*` is one word (no space), `**` anything; any when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Words of which the detail holds one, case ignored; any detail when empty.
    #[serde(default)]
    pub detail: Vec<String>,
    /// The status it applies to: FAIL (the default) or WARN.
    #[serde(default)]
    pub status: Option<Status>,
    /// The class.
    pub class: String,
}

impl Rule {
    /// How specific the rule is, compared in this order: it reads the detail, the name, the
    /// phase. The detail is where a check says the cause; a rule on the name alone is only
    /// that check's default.
    fn specificity(&self) -> (bool, bool, bool) {
        (
            !self.detail.is_empty(),
            self.name.is_some(),
            self.phase.is_some(),
        )
    }

    /// Whether it applies to `seen`, whose detail is `lowered` in lower case.
    fn applies(&self, seen: &Seen, lowered: &str) -> bool {
        self.status.unwrap_or(Status::Fail) == seen.status
            && self.phase.as_deref().is_none_or(|p| p == seen.phase)
            && self.name.as_deref().is_none_or(|n| glob(n, seen.name))
            && (self.detail.is_empty()
                || self
                    .detail
                    .iter()
                    .any(|d| lowered.contains(&d.to_lowercase())))
    }
}

/// The parts of a check that rules read; a check of this report or one from a rank's JSON.
#[derive(Clone, Copy, Debug)]
struct Seen<'a> {
    phase: &'a str,
    name: &'a str,
    status: Status,
    detail: &'a str,
}

impl<'a> Seen<'a> {
    fn of(check: &'a Check) -> Seen<'a> {
        Seen {
            phase: check.phase,
            name: &check.name,
            status: check.status,
            detail: &check.detail,
        }
    }

    /// A check as a report's JSON carries it; None where a field is missing.
    fn of_json(check: &'a Value) -> Option<Seen<'a>> {
        Some(Seen {
            phase: check["phase"].as_str()?,
            name: check["name"].as_str()?,
            status: Status::deserialize(&check["status"]).ok()?,
            detail: check["detail"].as_str().unwrap_or(""),
        })
    }
}

/// The table, parsed once.
pub fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        // The unit tests parse and validate the embedded file, so this cannot fail in a build
        // whose tests passed.
        serde_yaml::from_str(ACTIONS_YAML).expect("data/actions.yaml parses (its tests say so)")
    })
}

impl Table {
    /// The row of `class`.
    fn row(&self, class: &str) -> Option<&Row> {
        self.actions.iter().find(|r| r.class == class)
    }

    /// The class of `seen`: the best of the rules that apply and the Xids its detail names;
    /// `unclassified` for a FAIL check nothing matches; None for any other check nothing
    /// matches.
    fn classify<'t>(&'t self, seen: &Seen) -> Option<&'t Row> {
        if !matches!(seen.status, Status::Fail | Status::Warn) {
            return None;
        }
        let lowered = seen.detail.to_lowercase();
        // Higher wins: specificity, then severity, then the earlier rule.
        type Key = ((bool, bool, bool), Action, Reverse<usize>);
        let mut best: Option<(Key, &Row)> = None;
        let mut offer = |key: Key, row: &'t Row| {
            if best.as_ref().is_none_or(|(held, _)| key > *held) {
                best = Some((key, row));
            }
        };
        for (order, rule) in self.rules.iter().enumerate() {
            if !rule.applies(seen, &lowered) {
                continue;
            }
            if let Some(row) = self.row(&rule.class) {
                offer((rule.specificity(), row.action, Reverse(order)), row);
            }
        }
        // An Xid weighs as a rule on the detail alone, after every written rule on ties.
        for (k, xid) in xids(seen.detail).into_iter().enumerate() {
            let row = self
                .actions
                .iter()
                .find(|r| r.xid == Some(xid))
                .or_else(|| self.row(XID_OTHER));
            if let Some(row) = row {
                offer(
                    (
                        (true, false, false),
                        row.action,
                        Reverse(self.rules.len() + k),
                    ),
                    row,
                );
            }
        }
        match best {
            Some((_, row)) => Some(row),
            None if seen.status == Status::Fail => self.row(UNCLASSIFIED),
            None => None,
        }
    }

    /// The advice for `seen`, if it gets any.
    fn advice(&self, seen: &Seen) -> Option<Advice> {
        self.classify(seen).map(advice_of)
    }

    /// Whether `advice` is of a roll-up row, and which.
    fn rollup(&self, advice: &Advice) -> Option<Rollup> {
        self.row(&advice.class).and_then(|r| r.rollup)
    }
}

/// A row as the advice a check carries.
fn advice_of(row: &Row) -> Advice {
    Advice {
        action: row.action,
        class: row.class.clone(),
        why: row.why.clone(),
        source: row.source.clone(),
        section: (row.section != "n/a").then(|| row.section.clone()),
        see: row.see.clone(),
        escalate: row.escalate.clone(),
        fallback: row.fallback,
    }
}

/// The advice for a check given by its parts, for a check read back from another report's
/// JSON (certify's probe in a container): None where it gets none (PASS, SKIP, or a WARN no
/// rule names).
pub fn advice_for(phase: &str, name: &str, status: Status, detail: &str) -> Option<Advice> {
    table().advice(&Seen {
        phase,
        name,
        status,
        detail,
    })
}

/// Attaches its advice to every FAIL check of `report`, and to the WARN checks a rule names;
/// then gives the roll-up checks (a world's `rank N` and `world`) the worst advice of what
/// they stand for. Runs again to the same result.
pub fn advise(report: &mut Report) {
    let table = table();
    for check in &mut report.checks {
        check.advice = table.advice(&Seen::of(check));
    }
    lift_ranks(table, report);
    lift_report(table, report);
}

/// The first of the most severe: equal actions keep the earlier check's advice.
fn worst(candidates: impl IntoIterator<Item = Advice>) -> Option<Advice> {
    candidates
        .into_iter()
        .fold(None, |held: Option<Advice>, a| match held {
            Some(h) if h.action >= a.action => Some(h),
            _ => Some(a),
        })
}

/// Each `rank N` that failed locally takes the worst advice of that rank's own report, which
/// the world's facts carry (`facts.world.ranks[].report`).
fn lift_ranks(table: &Table, report: &mut Report) {
    let ranks = report.facts.get("world").map(|w| w["ranks"].clone());
    let Some(Value::Array(ranks)) = ranks else {
        return;
    };
    for check in &mut report.checks {
        let Some(advice) = &check.advice else {
            continue;
        };
        if table.rollup(advice) != Some(Rollup::Rank) {
            continue;
        }
        let Some(rank) = check
            .name
            .strip_prefix("rank ")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let Some(checks) = ranks
            .iter()
            .find(|r| r["rank"].as_u64() == Some(rank))
            .and_then(|r| r["report"]["checks"].as_array())
        else {
            continue;
        };
        let theirs = checks.iter().filter_map(|c| {
            let seen = Seen::of_json(c)?;
            // The rank's own gpubake advised it; where it did not, advise it here.
            let advice = Advice::deserialize(&c["advice"])
                .ok()
                .or_else(|| table.advice(&seen))?;
            Some(Advice {
                why: format!("rank {rank}'s `{}`: {}", seen.name, advice.why),
                ..advice
            })
        });
        if let Some(lifted) = worst(theirs) {
            check.advice = Some(lifted);
        }
    }
}

/// Each report-wide roll-up (a world's `world`) takes the worst advice of the other checks.
fn lift_report(table: &Table, report: &mut Report) {
    let others = report.checks.iter().filter_map(|c| {
        let advice = c.advice.as_ref()?;
        (table.rollup(advice) != Some(Rollup::Report)).then(|| Advice {
            why: format!("`{}`: {}", c.name, advice.why),
            ..advice.clone()
        })
    });
    let Some(lifted) = worst(others) else {
        return;
    };
    for check in &mut report.checks {
        if check
            .advice
            .as_ref()
            .is_some_and(|a| table.rollup(a) == Some(Rollup::Report))
        {
            check.advice = Some(lifted.clone());
        }
    }
}

/// Whether `name` fits `pattern`: `**` is any run of characters, `*` a run of one or more
/// that holds no space (one word: `GPU *` is `GPU 0`, not `GPU 0 ECC`), the rest literal.
fn glob(pattern: &str, name: &str) -> bool {
    fn fits(p: &[char], t: &[char]) -> bool {
        match p {
            [] => t.is_empty(),
            ['*', '*', rest @ ..] => (0..=t.len()).any(|i| fits(rest, &t[i..])),
            ['*', rest @ ..] => (1..=t.len())
                .take_while(|&i| t[i - 1] != ' ')
                .any(|i| fits(rest, &t[i..])),
            [c, rest @ ..] => t.first() == Some(c) && fits(rest, &t[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = name.chars().collect();
    fits(&p, &t)
}

/// The Xid codes `detail` names: `Xid 79`, `Xid: 79`, or the kernel's
/// `NVRM: Xid (PCI:0000:1b:00): 79, ...`. An `SXid` (an NVSwitch's, another catalog) or a
/// bare mention of Xids names none.
fn xids(detail: &str) -> Vec<u32> {
    let lower = detail.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut found = Vec::new();
    for (at, _) in lower.match_indices("xid") {
        if at > 0 && bytes[at - 1].is_ascii_alphanumeric() {
            continue;
        }
        let mut i = at + 3;
        let skip_blank = |i: &mut usize| {
            while *i < bytes.len() && matches!(bytes[*i], b' ' | b':') {
                *i += 1;
            }
        };
        skip_blank(&mut i);
        if bytes.get(i) == Some(&b'(') {
            match lower[i..].find(')') {
                Some(close) => i += close + 1,
                None => continue,
            }
            skip_blank(&mut i);
        }
        let digits = lower[i..].bytes().take_while(u8::is_ascii_digit).count();
        if let Ok(code) = lower[i..i + digits].parse() {
            found.push(code);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The class `table()` gives a check.
    fn class_of(phase: &str, name: &str, status: Status, detail: &str) -> Option<&'static str> {
        let seen = Seen {
            phase,
            name,
            status,
            detail,
        };
        table().classify(&seen).map(|r| r.class.as_str())
    }

    fn fail(phase: &str, name: &str, detail: &str) -> &'static str {
        class_of(phase, name, Status::Fail, detail).expect("a FAIL check always gets a class")
    }

    #[test]
    fn every_row_has_an_action_a_source_and_a_reason() {
        // The action is an `Action` or the file does not parse at all.
        let t = table();
        let mut classes = BTreeSet::new();
        let mut xids = BTreeSet::new();
        for r in &t.actions {
            let c = &r.class;
            assert!(
                classes.insert(c.as_str()),
                "{c}: a second row of this class"
            );
            assert!(
                !r.why.trim().is_empty() && !r.section.trim().is_empty(),
                "{c}"
            );
            match r.source.as_str() {
                "judgement" => {
                    assert_eq!(r.section, "n/a", "{c}: a judgement has no section");
                    assert!(
                        !r.see.is_empty(),
                        "{c}: a judgement names what it leaned on"
                    );
                    // A roll-up leans on other rows; every other judgement on a document.
                    assert!(
                        r.rollup.is_some() || r.see.iter().any(|s| s.contains("https://")),
                        "{c}: `see` names no document"
                    );
                }
                url => assert!(url.starts_with("https://"), "{c}: source {url}"),
            }
            match (r.action, r.fallback) {
                (Action::FixConfig, Some(f)) => assert_ne!(f, Action::FixConfig, "{c}"),
                (Action::FixConfig, None) => panic!("{c}: fix-config without a fallback"),
                (_, Some(_)) => panic!("{c}: a fallback on an action that is not fix-config"),
                _ => {}
            }
            if let Some(x) = r.xid {
                assert_eq!(*c, format!("xid_{x}"), "the row of Xid {x}");
                assert!(xids.insert(x), "Xid {x} twice");
            }
        }
        for needed in [UNCLASSIFIED, XID_OTHER] {
            assert!(classes.contains(needed), "{needed}");
        }
        assert!(t.sources.values().all(|u| u.starts_with("https://")));
    }

    #[test]
    fn every_rule_names_a_class_and_what_it_reads() {
        let t = table();
        for (i, r) in t.rules.iter().enumerate() {
            assert!(t.row(&r.class).is_some(), "rule {i}: no row {}", r.class);
            assert!(
                r.phase.is_some() || r.name.is_some() || !r.detail.is_empty(),
                "rule {i} ({}) matches everything",
                r.class
            );
            assert!(r.detail.iter().all(|d| !d.trim().is_empty()), "rule {i}");
            assert!(
                matches!(r.status, None | Some(Status::Warn)),
                "rule {i}: FAIL is the default; only WARN is written"
            );
        }
        // Every class is reached: by a rule, an Xid, or as the fallback.
        let ruled: BTreeSet<&str> = t.rules.iter().map(|r| r.class.as_str()).collect();
        for r in &t.actions {
            let c = r.class.as_str();
            assert!(
                ruled.contains(c) || r.xid.is_some() || c == UNCLASSIFIED || c == XID_OTHER,
                "{c}: no rule leads to it"
            );
        }
    }

    /// Every failure the probe reports, one line per kind: (phase, name, a detail as the
    /// probe words it, the class). Written from the `Status::Fail` sites of src/probe/*.rs,
    /// src/probe/world/*.rs and src/cdi.rs's preflight.
    #[rustfmt::skip]
    const FAILURES: &[(&str, &str, &str, &str)] = &[
        // src/probe/mod.rs: environment, cdi_preflight (src/cdi.rs)
        ("environment", "NVIDIA_DRIVER_CAPABILITIES", "utility: needs compute (CUDA) and utility (NVML, nvidia-smi)", "driver_capabilities"),
        ("environment", "/dev/nvidia*", "no device nodes", "container_device_nodes_missing"),
        ("environment", "libcuda.so.1", "not found: the CUDA driver was not injected", "toolkit_config_other"),
        ("environment", "libnvidia-ml.so.1", "not found: NVML was not injected", "toolkit_config_other"),
        ("cdi", "CDI spec", "no spec of kind nvidia.com/gpu in /etc/cdi or /var/run/cdi; `nvidia-ctk cdi generate` writes one", "cdi_spec_missing"),
        ("cdi", "CDI spec", "/etc/cdi/nvidia.yaml: expected a mapping", "cdi_spec_missing"),
        ("cdi", "CDI device nodes", "/etc/cdi/nvidia.yaml lists nodes the host lacks: /dev/nvidia3", "cdi_spec_stale"),
        ("cdi", "CDI driver libraries", "/etc/cdi/nvidia.yaml was written for another driver than the running 580.95.05: /usr/lib/libcuda.so.570.1; regenerate it (`nvidia-ctk cdi generate`)", "cdi_spec_stale"),
        // src/probe/limits.rs
        ("limits", "/dev/shm", "64 MiB, below 1 GiB: NCCL's shared-memory transport fails to set up", "container_limits"),
        ("limits", "RLIMIT_MEMLOCK", "64 KiB (hard 64 KiB), not unlimited: 2 RDMA devices here", "container_limits"),
        // src/probe/mod.rs nvml_phase, src/probe/nvml.rs
        ("nvml", "NVML", "stopped after 10 s at the end of level 1's 10 s budget: the driver is hung", "nvml_hang"),
        ("nvml", "NVML", "libnvidia-ml.so.1 is present but does not load: libpthread.so.0: cannot open shared object file. The image lacks libpthread.so.0", "image_defect"),
        ("nvml", "NVML", "NVML answers NVML_ERROR_UNKNOWN (\"Unknown Error\") while /dev/nvidia0 /dev/nvidiactl are present, and opening /dev/nvidiactl is refused (Operation not permitted): the container's device cgroup no longer allows the GPUs", "device_cgroup_lost"),
        ("nvml", "NVML", "NVML answers NVML_ERROR_UNKNOWN (\"Unknown Error\") while /dev/nvidia0 are present, yet /dev/nvidiactl opens, so the device cgroup still allows it: the driver itself failed (see the host's kernel log for an Xid)", "driver_error"),
        ("nvml", "NVML", "libnvidia-ml.so.1 could not be loaded: libnvidia-ml.so.1: cannot open shared object file; no NVIDIA GPU is visible to this docker: run the container with `--gpus all`", "container_device_nodes_missing"),
        ("nvml", "NVML", "NVML did not initialise: NVIDIA driver is not loaded; no NVIDIA GPU is visible to this host: install the NVIDIA driver", "driver_not_loaded"),
        ("nvml", "NVML", "NVML did not initialise: RM detects a driver/library version mismatch; no NVIDIA GPU is visible to this host", "driver_library_mismatch"),
        ("nvml", "NVML", "CUDA_VISIBLE_DEVICES=\"7\" shows this process none of the 2 GPUs NVML sees, so CUDA can open none; no NVIDIA GPU is visible to this docker", "toolkit_config_other"),
        ("nvml", "NVML", "NVML did not initialise: the current user does not have permission to perform this operation; no NVIDIA GPU is visible", "toolkit_config_other"),
        ("nvml", "GPUs", "no NVIDIA GPU is visible to this docker: run the container with `--gpus all`", "container_device_nodes_missing"),
        ("nvml", "GPUs", "NVML counts 8 GPUs but none of those asked for could be opened", "gpu_unopenable"),
        ("nvml", "GPU 1", "NVML cannot open this GPU: device fell off the bus or has otherwise become inacessible; the other GPUs are probed without it", "gpu_lost"),
        ("nvml", "GPU 1", "NVML cannot open this GPU: device requires a reset before it can be used again; the other GPUs are probed without it", "gpu_reset_required"),
        ("nvml", "GPU 1", "NVML cannot open this GPU: the infoROM is corrupted; the other GPUs are probed without it", "inforom_corrupt"),
        ("nvml", "GPU 1", "NVML cannot open this GPU: device's external power cables are not properly attached; the other GPUs are probed without it", "insufficient_power"),
        ("nvml", "GPU 1", "NVML cannot open this GPU: Unknown Error; the other GPUs are probed without it", "gpu_unopenable"),
        ("nvml", "GPU 0 ECC", "2 uncorrected ECC errors since the driver loaded: drain this GPU", "ecc_uncorrectable_volatile"),
        ("nvml", "GPU 0 PCIe link", "Gen4 x8 now, Gen4 x8 max, Gen5 x16 expected: the slot or riser limits the link", "pcie_link_degraded"),
        ("nvml", "GPU 0 NVLink", "12 of 18 links up: degraded NVLink", "nvlink_down"),
        // src/probe/causes.rs
        ("cuda", "cuInit", "no answer within 10 s: the driver is hung", "nvml_hang"),
        ("cuda", "cuInit", "cuInit returned 802 (CUDA_ERROR_SYSTEM_NOT_READY); NVML's GPU fabric: GPU 0 not started (status success, clique 0). On NVSwitch systems (HGX, DGX) CUDA waits for the fabric manager", "fabric_manager_not_ready"),
        ("cuda", "cuInit", "cuInit returned 802 (CUDA_ERROR_SYSTEM_NOT_READY); NVML's GPU fabric: GPU 0 in progress (status success, clique 0). On NVSwitch systems", "fabric_registration_incomplete"),
        ("cuda", "cuInit", "cuInit returned 803 (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH): the libcuda loaded is /usr/local/cuda/compat/libcuda.so.1, but the kernel module is 580.95.05; it is a forward-compatibility libcuda", "libcuda_mismatch"),
        ("cuda", "cuInit", "cuInit returned 804 (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE): libcuda.so.1 is a forward-compatibility libcuda on kernel module 535.1", "driver_too_old"),
        ("cuda", "cuInit", "cuInit returned 100 (CUDA_ERROR_NO_DEVICE) through libcuda.so.1: no GPU reaches this process", "container_device_nodes_missing"),
        ("cuda", "cuInit", "cuInit returned 999 through libcuda.so.1, CUDA 12.9", "driver_error"),
        // src/probe/mod.rs gpu_phases, src/probe/judge.rs
        ("cuda", "GPU 3", "not measured: NVML gave no PCI address, so its CUDA device cannot be found", "not_measured"),
        ("cuda", "CUDA", "no result within 120 s: killed (a hung kernel or driver call, or more work than the time allows)", "probe_timeout"),
        ("cuda", "CUDA", "the worker failed: Segmentation fault (core dumped)", "probe_crash"),
        ("cuda", "CUDA", "cuMemAlloc: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")", "gpu_busy"),
        ("cuda", "CUDA", "NVRTC: CompileError { log: \"...\" }", "worker_failed"),
        ("cuda", "CUDA devices", "no CUDA device at the PCI address of GPU 1; found: GPU 0 = CUDA 0 (0000:1b:00.0)", "toolkit_config_other"),
        ("cuda", "peer access", "no peer access: GPU 0->GPU 1, GPU 1->GPU 0", "p2p_blocked"),
        ("cuda", "peer access", "not measured: the worker returned no matrix for 2 GPUs", "not_measured"),
        ("cuda", "GPU 0 memory bandwidth", "2100 GB/s copy (read+write), below the H200 floor of 3500", "bandwidth_below_floor"),
        ("cuda", "GPU 0 memory bandwidth", "not measured: the worker returned no value", "not_measured"),
        ("cuda", "P2P 0->1", "120 GB/s one way, 200 GB/s both ways, a 4-byte copy every 2.1 µs back to back; below the H200 floor of 300", "bandwidth_below_floor"),
        ("cuda", "P2P 0->1", "not measured: no peer access between them", "p2p_blocked"),
        ("allreduce", "bundled all-reduce", "cuCtxEnablePeerAccess 0->1: DriverError(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, \"peer access is not supported between these two devices\")", "p2p_blocked"),
        ("allreduce", "bundled all-reduce", "NVRTC: CompileError", "worker_failed"),
        ("allreduce", "results", "f32 two-shot 1048576 B: 3 wrong (element 7: 2 != 3)", "silent_data_corruption"),
        ("allreduce", "results", "not measured: the worker returned no all-reduce", "not_measured"),
        ("allreduce", "bandwidth", "not measured: no float32 two-shot row in the worker's result", "not_measured"),
        ("allreduce", "all-reduce busbw", "150 GB/s at 1073741824 B, below the floor; floor 197, half the H200 P2P floor of 394", "bandwidth_below_floor"),
        ("allreduce", "all-reduce busbw", "not measured: the worker returned no time for the largest size", "not_measured"),
        ("allreduce", "busbw vs NCCL", "not measured: the worker returned no NCCL time", "not_measured"),
        ("allreduce", "throughput vs copy", "not measured: the worker returned no throughput for the largest size", "not_measured"),
        ("allreduce", "throughput vs copy", "not measured: the worker returned no plain-copy bandwidth to compare with", "not_measured"),
        ("allreduce", "preset vs NCCL defaults", "not measured: the run with the preset returned no bandwidth", "not_measured"),
        ("allreduce", "preset vs NCCL defaults", "ncclCommInitAll: NcclError(ncclInternalError)", "worker_failed"),
        // src/probe/mod.rs nccl_effective, ib_transport_run; src/probe/effective.rs
        ("nccl", "NCCL run", "cannot make a directory for NCCL's log: cannot make a temporary directory (/tmp: Read-only file system)", "worker_failed"),
        ("nccl", "NCCL run", "the worker failed: ncclCommInitAll; NCCL warned: Error while creating shared memory segment /dev/shm/nccl-Ab12 (size 9637888)", "container_limits"),
        ("nccl", "NCCL_ALGO", "NCCL refused `Ring,Foo`, in its words: Invalid value Foo for NCCL_ALGO", "nccl_setting_rejected"),
        ("nccl", "NCCL_BUFFSIZE", "NCCL read `4M` as 4: it parses this variable as a number and stops at the first character that is not a digit", "nccl_setting_rejected"),
        ("nccl", "transports", "the preset expects NVLink P2P (preset h200), but NCCL went around it: GPU 0 -> GPU 1: SHM/direct/direct (channels 0-1)", "nccl_path_not_as_preset"),
        ("nccl", "IB transport", "NCCL could not open libibverbs (\"NET/IB : failed to open libibverbs.so\"): across nodes it would run over TCP sockets", "image_defect"),
        ("nccl", "IB transport", "cannot make a directory for NCCL's log: cannot make a temporary directory", "worker_failed"),
        // src/probe/mod.rs compatibility, require_checks, nccl_check; src/probe/transport.rs
        ("compatibility", "lock", "/opt/gpubake/lock.yaml does not parse: missing field `torch`", "image_defect"),
        ("compatibility", "driver floor", "driver 535.1, the lock needs >= 550.54 for CUDA 12.4 (torch==2.5.1)", "driver_too_old"),
        ("compatibility", "NVIDIA_REQUIRE_CUDA", "`cuda>=12.9 brand=tesla`: GPU 0: needs CUDA >= 12.9, the driver supports 12.4", "requirement_unmet"),
        ("compatibility", "NVIDIA_REQUIRE_CUDA", "`cuda>>12` does not parse: unknown operator", "image_defect"),
        ("compatibility", "libnccl.so.2", "2.21.5, but the lock pins 2.27.3; loads /opt/venv/lib/libnccl.so.2", "image_defect"),
        ("compatibility", "libnccl.so.2", "libnccl.so.2 does not load: undefined symbol; loads /opt/venv/lib/libnccl.so.2", "image_defect"),
        ("compatibility", "libibverbs.so.1", "the IB verbs library (the image sets NCCL_NET=IB): libibverbs.so.1: cannot open shared object file: NCCL would run across nodes over TCP sockets", "image_defect"),
        ("compatibility", "libmlx5.so.1", "the Mellanox provider (the node has mlx5_0): libmlx5.so.1: cannot open shared object file", "image_defect"),
        // src/probe/framework.rs, src/probe/mod.rs framework_phase
        ("framework", "torch", "torch 2.8.0+cu128, but the lock pins 2.9.0+cu129", "image_defect"),
        ("framework", "torch", "torch 2.9.0+cu129 is built for CUDA 12.8, the lock pins 12.9", "image_defect"),
        ("framework", "torch", "rank 0 gave no result within 180 s and was killed: ", "probe_timeout"),
        ("framework", "torch", "rank 1 ended without a result: Traceback (most recent call last)", "probe_crash"),
        ("framework", "torch", "cannot start /opt/venv/bin/python: No such file or directory", "worker_failed"),
        ("framework", "torch", "no free port for the ranks' rendezvous: Address in use", "worker_failed"),
        ("framework", "cuDNN from torch", "torch uses cuDNN 9.1.0; the lock pins 9.10", "image_defect"),
        ("framework", "CUDA from torch", "torch 2.9.0 cannot initialise CUDA: CUDA driver version is insufficient for CUDA runtime version", "driver_too_old"),
        ("framework", "CUDA from torch", "torch 2.9.0 cannot initialise CUDA: CUDA unknown error", "worker_failed"),
        ("framework", "GPU architecture in torch", "NVIDIA B200 is sm_100, and torch was built for sm_80, sm_90 only: every kernel fails with \"no kernel image is available for execution\"", "image_defect"),
        ("framework", "bf16 GEMM, rank 0 (NVIDIA H200)", "CUDA error: an illegal memory access was encountered", "cuda_kernel_fault"),
        ("framework", "bf16 GEMM, rank 0 (NVIDIA H200)", "CUDA error: uncorrectable ECC error encountered", "ecc_uncorrectable_volatile"),
        ("framework", "bf16 GEMM, rank 0 (NVIDIA H200)", "wrong: relative error 3.10e-1 against the CPU reference (tolerance 2e-2)", "silent_data_corruption"),
        ("framework", "bf16 GEMM, rank 0 (NVIDIA H200)", "410 TFLOP/s at 8192x8192, below the floor of 600; right against the CPU reference (relative error 1.0e-3)", "gemm_rate_below_floor"),
        ("framework", "bf16 GEMM, rank 0 (NVIDIA H200)", "no measurement", "not_measured"),
        ("framework", "cuDNN convolution, rank 1 (NVIDIA H200)", "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", "worker_failed"),
        ("framework", "cuDNN convolution, rank 1 (NVIDIA H200)", "wrong: relative error 1.2e0 against the CPU reference", "silent_data_corruption"),
        ("framework", "cuDNN convolution, rank 1 (NVIDIA H200)", "cuDNN is not available to torch", "image_defect"),
        ("framework", "cuDNN convolution, rank 1 (NVIDIA H200)", "no measurement", "not_measured"),
        ("framework", "torch.distributed all-reduce", "NCCL error: unhandled system error", "worker_failed"),
        ("framework", "torch.distributed all-reduce", "2 ranks summed to Some(2.0), not Some(3.0)", "silent_data_corruption"),
        ("framework", "torch's NCCL", "torch binds NCCL 2.21.5 from /opt/venv/lib/libnccl.so.2, but the lock pins 2.27.3", "image_defect"),
        ("framework", "libraries torch mapped", "libnvJitLink.so.12 is mapped from /usr/local/cuda-12.4/lib64/libnvJitLink.so.12.4.127, not from the image's wheel (/opt/gpubake/venv/lib/python3.11/site-packages/nvidia/nvjitlink/lib/libnvJitLink.so.12): a plain dlopen of libnvJitLink.so.12 finds it through LD_LIBRARY_PATH", "image_defect"),
        ("framework", "libraries torch mapped", "the rank listed no site-packages, so the copies torch bound cannot be held to the image's wheels", "not_measured"),
        // src/probe/burn.rs: level 3
        ("burn", "GPU 0 GEMMs", "the worker's result: missing field `tflops`", "worker_failed"),
        ("burn", "GPU 0 GEMMs", "libcublas.so could not be loaded: level 3's GEMMs need cuBLAS", "image_defect"),
        ("burn", "GPU 0 GEMMs", "cublasGemmEx: DriverError(CUDA_ERROR_ECC_UNCORRECTABLE, \"uncorrectable ECC error encountered\")", "ecc_uncorrectable_volatile"),
        ("burn", "GPU 0 GEMMs", "stopped after 400 s at the end of level 3's 780 s budget: killed (a hung kernel or driver call, or more work than the time allows)", "probe_timeout"),
        ("burn", "GPU 0 health under load", "NVML cannot open it: Unknown Error", "gpu_unopenable"),
        ("burn", "GPU 0 health under load", "NVML cannot open it: device fell off the bus or has otherwise become inacessible", "gpu_lost"),
        ("burn", "GPU 0 health under load", "no NVML reading during the burn", "not_measured"),
        ("burn", "GPU 0 clocks under load", "hardware slowdown in 3 of 10 reads; SM clock median 900 MHz, lowest 700 MHz (max 1980 MHz)", "hw_slowdown"),
        ("burn", "GPU 0 clocks under load", "hardware thermal slowdown in 4 of 10 reads; SM clock median 1200 MHz", "thermal_slowdown"),
        ("burn", "GPU 0 clocks under load", "power brake (the supply asked the GPU to slow) in 2 of 10 reads; SM clock median 1200 MHz", "power_brake"),
        ("burn", "GPU 0 clocks under load", "software thermal slowdown in 5 of 10 reads; SM clock median 1500 MHz", "thermal_slowdown"),
        ("burn", "GPU 0 temperature under load", "91 °C, at or past the 90 °C where it slows itself: cooling", "thermal_slowdown"),
        ("burn", "GPU 0 memory errors under load", "2 uncorrected ECC errors", "ecc_uncorrectable_volatile"),
        ("burn", "GPU 0 memory errors under load", "1 rows remapped for uncorrectable errors", "row_remap_pending"),
        ("burn", "GPU 0 memory errors under load", "a row remap waits for a GPU reset", "row_remap_pending"),
        ("burn", "GPU 0 memory errors under load", "a row remap failed", "row_remap_failure"),
        ("burn", "GPU 0 memory errors under load", "pages wait to be retired", "retired_pages_pending"),
        ("burn", "GPU 0 GEMM rate", "no GEMM was timed", "not_measured"),
        ("burn", "GPU 0 GEMM rate", "410 TFLOP/s median over 9000 GEMMs in 600 s (lowest batch 400), below the 600 TFLOP/s floor of H200", "gemm_rate_below_floor"),
        ("burn", "GPU 0 GEMM repeats", "3 of 1000 elements differ from the first result over 5 readbacks: silent data corruption (first: C[1,2] = 1e0, expected 2e0)", "silent_data_corruption"),
        ("burn", "GPU 0 GEMM repeats", "nothing was compared", "not_measured"),
        ("burn", "GPU 0 GEMM against the CPU", "1 of 4096 elements differ from the CPU's exact tiles: silent data corruption", "silent_data_corruption"),
        ("burn", "GPU 0 GEMM against the CPU", "nothing was compared", "not_measured"),
        ("burn", "GPU 0 GEMM whole product", "1 of 8192 rows of C·x differ from A·(B·x): silent data corruption (first: row 4000: C·x = 1, A·(B·x) = 2)", "silent_data_corruption"),
        ("burn", "GPU 0 GEMM whole product", "nothing was compared", "not_measured"),
        ("burn", "GEMM across GPUs", "GPU 3 differ from the others' result: silent data corruption", "silent_data_corruption"),
        ("burn", "GEMM across GPUs", "GPU 0, GPU 1 give 2 different results and no majority: silent data corruption on at least one", "silent_data_corruption"),
        ("burn", "burn length", "300 s of the 600 s asked: the steps before it took 421 s of their 120 s", "probe_timeout"),
        ("burn", "GPU 0 clocks under load", "not measured: none of NVML's 600 reads gave the SM clock or the throttle reasons", "not_measured"),
        ("burn", "GPU 0 temperature under load", "not measured: none of NVML's 600 reads gave the temperature", "not_measured"),
        ("burn", "GPU 0 memory errors under load", "not measured: remapped rows read on one side of the burn only", "not_measured"),
        // src/probe/mod.rs run: the level's budget
        ("budget", "level 3", "ran past its 780 s budget in step `burn`; what that step had not measured is missing", "probe_timeout"),
        ("budget", "level 2", "ran past its 120 s budget in step `all-reduce`; what that step had not measured is missing", "probe_timeout"),
        ("budget", "level 1", "ran past its 10 s budget in step `NVML`; what that step had not measured is missing", "nvml_hang"),
        ("budget", "level 1", "ran past its 10 s budget in step `cuInit`; what that step had not measured is missing", "nvml_hang"),
        // src/probe/world/mod.rs, verdict.rs, judge.rs
        ("probe", "local probe", "usage: --devices 7: this node has GPUs 0 to 1", "launch_config"),
        ("world", "rendezvous", "no answer from rank 0 at node-a:29500 within 60 s", "rendezvous_failed"),
        ("world", "rank 2", "missing: no hello within 60 s", "rendezvous_failed"),
        ("world", "rank 2", "missing: its hello was refused: world size 4, expected 8", "rendezvous_failed"),
        ("world", "rank 2", "dead: node-b (pid 7) said hello, then its connection closed before its report", "rendezvous_failed"),
        ("world", "rank 2", "slow: node-b (pid 7) said hello but sent no report within 60 s of the broadcast", "rendezvous_failed"),
        ("world", "rank 2", "node-b (pid 7): a report of 9 MB, more than allowed", "rank_failed_locally"),
        ("world", "rank 2", "node-b (pid 7): local exit 1; failed: GPU 0 GEMM repeats", "rank_failed_locally"),
        ("world", "rank 2", "node-b (pid 7): local exit 2", "rank_failed_locally"),
        ("world", "rank 2", "node-b (pid 7): no GPU (local exit 3); its report is in the JSON", "rank_failed_locally"),
        ("world", "refused hellos", "node-c: world size 4, expected 8", "launch_config"),
        ("world", "broadcast", "ranks 3 received bytes other than rank 0 sent", "transfer_corrupt"),
        ("world", "NCCL across ranks", "rank 3 (seat 3) sent no report, so NCCL could not finish", "worker_failed"),
        ("world", "all-reduce busbw across ranks", "not measured: no rank returned a time", "not_measured"),
        ("world", "all-gather busbw across ranks", "not measured: no rank returned a time", "not_measured"),
        ("world", "slowest pair", "not measured: no rank returned a pair", "not_measured"),
        ("world", "transport rank 0 - rank 4", "rank 0 -> rank 4: the preset sets NCCL_NET=IB, yet NCCL sent over NET/Socket; NET/Socket/0 (channels 0-1)", "nccl_path_not_as_preset"),
        ("world", "preset vs NCCL defaults across ranks", "the run under NCCL's defaults did not complete: rank 1 (node-b): failed", "worker_failed"),
        ("world", "preset vs NCCL defaults across ranks", "not measured: no all-reduce time in one of the runs", "not_measured"),
        ("world", "world", "3 of 4 ranks reported (launched by torchrun; rank 0 on node-a, port 29500); missing: 3", "world_failed"),
    ];

    #[test]
    fn every_failure_the_probe_reports_has_its_class() {
        let mut wrong = Vec::new();
        for (phase, name, detail, want) in FAILURES {
            let got = fail(phase, name, detail);
            if got != *want || got == UNCLASSIFIED {
                wrong.push(format!(
                    "{phase} / {name} / {detail:?}: {got}, expected {want}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// The `Status::Fail` sites of each file, outside its tests, when FAILURES was written.
    const FAIL_SITES: &[(&str, usize)] = &[
        ("src/probe/burn.rs", 18),
        ("src/probe/causes.rs", 6),
        ("src/probe/effective.rs", 4),
        ("src/probe/framework.rs", 18),
        ("src/probe/judge.rs", 15),
        ("src/probe/limits.rs", 2),
        ("src/probe/mod.rs", 25),
        ("src/probe/nvml.rs", 4),
        ("src/probe/transport.rs", 1),
        ("src/probe/world/judge.rs", 6),
        ("src/probe/world/mod.rs", 3),
        ("src/probe/world/verdict.rs", 10),
    ];

    /// Files whose `Status::Fail` is no check of the probe's.
    const NOT_CHECKS: &[&str] = &["/report.rs", "/emit.rs", "/actions.rs"];

    /// A new failure the probe can report must come with its class: when a file's count of
    /// `Status::Fail` changes, FAILURES (and perhaps the rules) is to be read again.
    #[test]
    fn the_failure_sites_are_the_ones_listed() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files: Vec<String> = Vec::new();
        for dir in ["src/probe", "src/probe/world"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        files.sort();
        let mut changed = Vec::new();
        for file in files {
            // Files that name the status without making a check: the renderers and metrics
            // count statuses, and this file names them in its cases.
            if NOT_CHECKS.iter().any(|n| file.ends_with(n)) {
                continue;
            }
            let text = std::fs::read_to_string(root.join(&file)).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let sites = code.matches("Status::Fail").count();
            let listed = FAIL_SITES
                .iter()
                .find(|(f, _)| *f == file)
                .map_or(0, |(_, n)| *n);
            if sites != listed {
                changed.push(format!("{file}: {sites} sites, {listed} listed"));
            }
        }
        assert!(
            changed.is_empty(),
            "failure checks were added or removed; give each its line in FAILURES (and a rule \
             in data/actions.yaml where none fits), then update FAIL_SITES:\n{}",
            changed.join("\n")
        );
    }

    /// One case for each class the probe's failures above do not reach: Xids, DCGM's and
    /// NVML's names of a state, and the warnings that carry an action.
    #[rustfmt::skip]
    const OTHER_CASES: &[(&str, &str, Status, &str, &str)] = &[
        ("nvml", "GPU 0 ECC", Status::Warn, "pages are pending retirement: reset the GPU when it is idle", "retired_pages_pending"),
        ("burn", "GPU 0 memory errors under load", Status::Warn, "14 corrected ECC errors during the burn", "ecc_corrected_high"),
        ("nvml", "GPU 0 recovery", Status::Fail, "NVML_GPU_RECOVERY_ACTION_GPU_RESET", "gpu_recovery_action_gpu_reset"),
        ("nvml", "GPU 0 recovery", Status::Fail, "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT", "gpu_recovery_action_node_reboot"),
        ("nvml", "GPU 0 recovery", Status::Fail, "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P", "gpu_recovery_action_drain_p2p"),
        ("nvml", "GPU 0 recovery", Status::Fail, "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", "gpu_recovery_action_drain_and_reset"),
        ("dcgm", "diag", Status::Fail, "DCGM_FR_UNCORRECTABLE_ROW_REMAP_LIMIT on GPU 2", "row_remap_uncorrectable_limit"),
        ("dcgm", "diag", Status::Fail, "DCGM_FR_ROW_REMAP_FAILURE on GPU 2", "row_remap_failure"),
        ("dcgm", "diag", Status::Fail, "DCGM_FR_PENDING_ROW_REMAP on GPU 2", "row_remap_pending"),
        ("dcgm", "diag", Status::Fail, "DCGM_FR_RETIRED_PAGES_LIMIT on GPU 2", "retired_pages_count_over_limit"),
        ("dcgm", "diag", Status::Fail, "DCGM_FR_PENDING_PAGE_RETIREMENTS on GPU 2", "retired_pages_pending"),
        ("dcgm", "diag", Status::Fail, "DCGM_FR_NVLINK_DOWN on GPU 2", "nvlink_down"),
        ("dcgm", "diag", Status::Fail, "DCGM_FR_CLOCKS_EVENT_POWER on GPU 2", "sw_power_cap"),
        ("cuda", "CUDA", Status::Fail, "cuLaunchKernel: DriverError(CUDA_ERROR_NVLINK_UNCORRECTABLE, \"uncorrectable NVLink error detected during the execution\")", "xid_74"),
        ("cuda", "CUDA", Status::Fail, "cuModuleLoadData: DriverError(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, \"the provided PTX was compiled with an unsupported toolchain.\")", "driver_too_old"),
        ("cuda", "CUDA", Status::Fail, "cuCtxCreate: DriverError(CUDA_ERROR_DEVICES_UNAVAILABLE, \"all CUDA-capable devices are busy or unavailable\")", "gpu_busy"),
        ("something", "new", Status::Fail, "a failure no rule has met", UNCLASSIFIED),
        ("something", "new", Status::Fail, "Xid 4242 seen", XID_OTHER),
    ];

    #[test]
    fn each_class_has_a_case_and_each_case_its_class() {
        let mut covered: BTreeSet<&str> = FAILURES.iter().map(|f| f.3).collect();
        for (phase, name, status, detail, want) in OTHER_CASES {
            assert_eq!(
                class_of(phase, name, *status, detail),
                Some(*want),
                "{detail}"
            );
            covered.insert(want);
        }
        for r in table().actions.iter().filter(|r| r.xid.is_none()) {
            assert!(covered.contains(r.class.as_str()), "{}: no case", r.class);
        }
        // Every Xid row, through the kernel's own line.
        for r in table().actions.iter().filter(|r| r.xid.is_some()) {
            let line = format!(
                "NVRM: Xid (PCI:0000:1b:00): {}, pid=1101, name=python",
                r.xid.unwrap()
            );
            assert_eq!(
                class_of("cuda", "CUDA", Status::Fail, &line),
                Some(r.class.as_str())
            );
        }
    }

    #[test]
    fn the_more_severe_of_two_causes_in_one_detail_wins() {
        // Both are read off the detail, equally specific: the node is treated for the worse.
        let both =
            "2 uncorrected ECC errors, a row remap failed, a row remap waits for a GPU reset";
        assert_eq!(
            fail("burn", "GPU 0 memory errors under load", both),
            "row_remap_failure"
        );
        // A crash whose last words name a small /dev/shm is the limit, not the crash.
        let crash = "the worker failed: NCCL WARN Error while creating shared memory segment";
        assert_eq!(fail("cuda", "CUDA", crash), "container_limits");
        // Xid 48 (reset) with the remap event it brings (Xid 63, none).
        assert_eq!(fail("cuda", "CUDA", "Xid 63, Xid 48"), "xid_48");
        // A by-product Xid 45 gives way to the Xid it follows.
        assert_eq!(fail("cuda", "CUDA", "Xid 45 after Xid 13"), "xid_13");
    }

    #[test]
    fn a_cause_in_the_detail_beats_the_checks_default_even_when_milder() {
        // The NVML check's default is a driver fault (reboot); a lost device cgroup is a
        // container to restart (fix-config), and the detail says which it is.
        let lost = "NVML answers Unknown Error while /dev/nvidia0 are present, and opening \
                    /dev/nvidiactl is refused (Operation not permitted)";
        let row = table()
            .classify(&Seen {
                phase: "nvml",
                name: "NVML",
                status: Status::Fail,
                detail: lost,
            })
            .unwrap();
        assert_eq!(
            (row.class.as_str(), row.action),
            ("device_cgroup_lost", Action::FixConfig)
        );
        assert_eq!(fail("nvml", "NVML", "Unknown Error"), "driver_error");
        // A missing value gives way to the cause it carries, milder or not.
        assert_eq!(
            fail(
                "cuda",
                "P2P 0->1",
                "not measured: DriverError(CUDA_ERROR_ECC_UNCORRECTABLE, \"uncorrectable ECC error encountered\")"
            ),
            "ecc_uncorrectable_volatile"
        );
        assert_eq!(
            fail("burn", "GPU 0 GEMM repeats", "nothing was compared"),
            "not_measured"
        );
    }

    #[test]
    fn a_cause_in_the_detail_beats_the_checks_default_when_worse() {
        let ecc = "cublasGemmEx: DriverError(CUDA_ERROR_ECC_UNCORRECTABLE, \"uncorrectable ECC error encountered\")";
        assert_eq!(
            fail("burn", "GPU 0 GEMMs", ecc),
            "ecc_uncorrectable_volatile"
        );
        assert_eq!(
            fail(
                "burn",
                "GPU 0 GEMMs",
                "cublasGemmEx: CUBLAS_STATUS_EXECUTION_FAILED"
            ),
            "worker_failed"
        );
        // A budget that ran out in a driver call is the driver's hang, not the probe's slowness.
        assert_eq!(
            fail(
                "budget",
                "level 1",
                "ran past its 10 s budget in step `NVML`"
            ),
            "nvml_hang"
        );
        assert_eq!(
            fail(
                "budget",
                "level 3",
                "ran past its 780 s budget in step `burn`"
            ),
            "probe_timeout"
        );
    }

    #[test]
    fn equal_actions_go_to_the_narrower_cause_written_first() {
        let name = "GPU 0 clocks under load";
        // HW_SLOWDOWN is set along with the bit that says why; the why is the class.
        let brake = "hardware slowdown in 3 of 10 reads, power brake (the supply asked the GPU to slow) in 3 of 10 reads";
        assert_eq!(fail("burn", name, brake), "power_brake");
        let hot = "hardware slowdown in 3 of 10 reads, hardware thermal slowdown in 3 of 10 reads";
        assert_eq!(fail("burn", name, hot), "thermal_slowdown");
        // The Xid and the NVML words for one lost GPU: the rule is written before any Xid.
        let lost = "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.";
        assert_eq!(fail("nvml", "GPU 0", lost), "gpu_lost");
        // Fabric registration still under way is a wait, not the fabric manager's absence.
        let waiting = "cuInit returned 802 (CUDA_ERROR_SYSTEM_NOT_READY); NVML's GPU fabric: GPU 0 in progress (status success, clique 0)";
        assert_eq!(
            fail("cuda", "cuInit", waiting),
            "fabric_registration_incomplete"
        );
        assert_eq!(
            fail(
                "framework",
                "CUDA from torch",
                "CUDA error: system not yet initialized"
            ),
            "fabric_manager_not_ready"
        );
    }

    #[test]
    fn warnings_get_advice_only_where_a_rule_says_and_passes_never() {
        let ecc = "3 corrected ECC errors during the burn";
        assert_eq!(
            class_of("burn", "GPU 0 memory errors under load", Status::Warn, ecc),
            Some("ecc_corrected_high")
        );
        assert_eq!(
            class_of(
                "nvml",
                "GPU 0 clocks",
                Status::Warn,
                "SM 900/1980 MHz, slowed down"
            ),
            None
        );
        assert_eq!(
            class_of("nvml", "GPU 0 ECC", Status::Pass, "uncorrected"),
            None
        );
        assert_eq!(
            class_of("cdi", "CDI spec", Status::Skip, "none in /etc/cdi"),
            None
        );
        // A FAIL rule does not reach a WARN of the same check, nor a WARN rule a FAIL.
        assert_eq!(
            class_of("nvml", "GPU 0 NVLink", Status::Warn, "no NVLink links up"),
            None
        );
        assert_eq!(
            fail("nvml", "GPU 0 ECC", "pages are pending retirement"),
            "ecc_uncorrectable_volatile"
        );
        // A warning that names an Xid takes its row.
        assert_eq!(
            class_of("nvml", "GPU 0 ECC", Status::Warn, "Xid 92 seen"),
            Some("xid_92")
        );
    }

    #[test]
    fn names_match_word_by_word() {
        assert!(glob("GPU *", "GPU 12"));
        assert!(!glob("GPU *", "GPU 0 ECC"));
        assert!(!glob("GPU *", "GPU "));
        assert!(glob("GPU * ECC", "GPU 0 ECC"));
        assert!(glob("P2P *", "P2P 0->1"));
        assert!(glob("NCCL_*", "NCCL_IB_HCA"));
        assert!(!glob("NCCL_*", "NCCL run"));
        assert!(glob("bf16 GEMM, **", "bf16 GEMM, rank 0 (NVIDIA H200)"));
        assert!(glob("/dev/nvidia*", "/dev/nvidia*"));
        assert!(glob(
            "transport rank * - rank *",
            "transport rank 0 - rank 4"
        ));
    }

    #[test]
    fn xids_are_read_in_the_ways_logs_write_them() {
        assert_eq!(
            xids("NVRM: Xid (PCI:0000:1b:00): 79, pid=1101, GPU has fallen off the bus."),
            [79]
        );
        assert_eq!(xids("Xid 48 then XID: 63"), [48, 63]);
        assert_eq!(xids("SXid 12 from an NVSwitch"), Vec::<u32>::new());
        assert_eq!(
            xids("see the host's kernel log for an Xid)"),
            Vec::<u32>::new()
        );
        assert_eq!(xids("class xid_other"), Vec::<u32>::new());
        assert_eq!(xids("Xid (PCI:0000:1b:00"), Vec::<u32>::new());
    }

    fn report_of(checks: &[(&'static str, &str, Status, &str)]) -> Report {
        let mut report = Report::default();
        for (phase, name, status, detail) in checks {
            report.push(phase, *name, *status, *detail);
        }
        report
    }

    #[test]
    fn advise_marks_failures_and_leaves_the_rest_as_they_were() {
        let mut report = report_of(&[
            ("environment", "runs in", Status::Pass, "docker"),
            ("limits", "/dev/shm", Status::Fail, "64 MiB, below 1 GiB"),
            (
                "burn",
                "GPU 0 memory errors under load",
                Status::Warn,
                "2 corrected ECC errors during the burn",
            ),
            ("nvml", "GPU 0 model", Status::Warn, "no policy entry"),
        ]);
        let before = serde_json::to_value(&report.checks[0]).unwrap();
        advise(&mut report);
        assert_eq!(serde_json::to_value(&report.checks[0]).unwrap(), before);
        let shm = report.checks[1].advice.clone().unwrap();
        assert_eq!(
            (shm.action, shm.fallback),
            (Action::FixConfig, Some(Action::None))
        );
        assert!(
            shm.source.starts_with("https://docs.nvidia.com/"),
            "{shm:?}"
        );
        assert_eq!(
            shm.section.as_deref(),
            Some("Memory issues > Shared memory > Docker")
        );
        assert_eq!(
            report.checks[2].advice.as_ref().unwrap().action,
            Action::None
        );
        assert!(report.checks[3].advice.is_none());
        let once: Vec<_> = report.checks.iter().map(|c| c.advice.clone()).collect();
        advise(&mut report);
        let twice: Vec<_> = report.checks.iter().map(|c| c.advice.clone()).collect();
        assert_eq!(once, twice);
        let json = serde_json::to_value(&report.checks[1]).unwrap();
        assert_eq!(json["advice"]["class"], "container_limits");
        assert_eq!(
            advice_for("limits", "/dev/shm", Status::Fail, "64 MiB"),
            Some(shm)
        );
    }

    #[test]
    fn a_world_takes_the_worst_advice_of_its_ranks_own_reports() {
        let mut report = report_of(&[
            ("world", "rank 0", Status::Pass, "passed locally"),
            (
                "world",
                "rank 1",
                Status::Fail,
                "node-b (pid 7): local exit 1; failed: GPU 0 GEMM repeats",
            ),
            (
                "world",
                "rank 2",
                Status::Fail,
                "missing: no hello within 60 s",
            ),
            (
                "world",
                "rank 3",
                Status::Fail,
                "node-d (pid 9): local exit 1; failed: GPU 1 ECC",
            ),
            ("world", "world", Status::Fail, "2 of 4 ranks reported"),
        ]);
        let local = |checks: serde_json::Value| serde_json::json!({"checks": checks});
        report.fact(
            "world",
            serde_json::json!({"ranks": [
                {"rank": 1, "state": "reported", "report": local(serde_json::json!([
                    {"phase": "burn", "name": "GPU 0 clocks under load", "status": "FAIL",
                     "detail": "hardware thermal slowdown in 3 of 10 reads"},
                    {"phase": "burn", "name": "GPU 0 GEMM repeats", "status": "FAIL",
                     "detail": "3 of 9 elements differ from the first result: silent data corruption"}
                ]))},
                // Rank 3's own gpubake advised it already; its advice is taken as it is.
                {"rank": 3, "state": "reported", "report": local(serde_json::json!([
                    {"phase": "nvml", "name": "GPU 1 ECC", "status": "FAIL", "detail": "2 uncorrected",
                     "advice": {"action": "reset-gpu", "class": "ecc_uncorrectable_volatile",
                                "why": "drain, then reset", "source": "https://example.org"}}
                ]))},
                {"rank": 2, "state": "missing"}
            ]}),
        );
        advise(&mut report);
        let advice = |i: usize| report.checks[i].advice.clone();
        assert!(advice(0).is_none());
        // Thermal and corruption both drain; the first of the rank's checks is kept.
        let one = advice(1).unwrap();
        assert_eq!(
            (one.class.as_str(), one.action),
            ("thermal_slowdown", Action::DrainAndReplace)
        );
        assert!(
            one.why.starts_with("rank 1's `GPU 0 clocks under load`: "),
            "{}",
            one.why
        );
        assert_eq!(advice(2).unwrap().class, "rendezvous_failed");
        let three = advice(3).unwrap();
        assert_eq!(
            (three.action, three.why.as_str()),
            (Action::ResetGpu, "rank 3's `GPU 1 ECC`: drain, then reset")
        );
        let world = advice(4).unwrap();
        assert_eq!(world.action, Action::DrainAndReplace);
        assert!(world.why.starts_with("`rank 1`: rank 1's"), "{}", world.why);
    }

    #[test]
    fn a_rank_without_its_report_keeps_the_rows_own_advice() {
        let mut report = report_of(&[
            (
                "world",
                "rank 1",
                Status::Fail,
                "node-b (pid 7): local exit 2",
            ),
            (
                "world",
                "world",
                Status::Fail,
                "1 of 2 ranks failed locally",
            ),
        ]);
        advise(&mut report);
        let one = report.checks[0].advice.as_ref().unwrap();
        assert_eq!(
            (one.class.as_str(), one.action),
            ("rank_failed_locally", Action::Rerun)
        );
        let world = report.checks[1].advice.as_ref().unwrap();
        assert_eq!(
            (world.class.as_str(), world.action),
            ("rank_failed_locally", Action::Rerun)
        );
    }
}
