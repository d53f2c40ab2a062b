//! Rank 0's judgement of NCCL across ranks, from what each rank sent back (its `world_nccl`
//! fact): did every seated rank join the communicator and get correct results, the bus
//! bandwidth of all-reduce and all-gather, the transport between each pair of ranks as NCCL
//! logged it, checked against what each rank's preset asks for, and the slowest pair.

use super::nccl::{FACT, FACT_DEFAULTS};
use crate::probe::nccl_log::ranges;
use crate::probe::report::{Report, Status};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The phase of these checks: the world's.
const PHASE: &str = super::verdict::PHASE;

/// A rank that reported, with its local report.
pub struct Entry<'a> {
    /// World rank.
    pub rank: u32,
    /// Its host name.
    pub host: &'a str,
    /// Its report as JSON.
    pub report: &'a Value,
}

impl Entry<'_> {
    fn fact(&self) -> Option<&Value> {
        self.report["facts"].get(FACT)
    }

    /// Where NCCL thinks this rank runs: NCCL_HOSTID when set, the host name otherwise.
    fn node(&self) -> String {
        self.fact()
            .and_then(|f| f["hostid"].as_str())
            .map_or_else(|| self.host.to_string(), String::from)
    }

    fn name(&self) -> String {
        format!("rank {} ({})", self.rank, self.host)
    }
}

/// Adds the checks of NCCL across ranks. `seated` is rank 0's seating: the world rank of each
/// communicator rank.
pub fn checks(seated: &[u32], entries: &[Entry], report: &mut Report) {
    let by_rank: BTreeMap<u32, &Entry> = entries.iter().map(|e| (e.rank, e)).collect();
    if seated.is_empty() {
        let mut reasons: Vec<String> = entries
            .iter()
            .filter_map(|e| {
                e.fact()
                    .and_then(|f| f["skipped"].as_str())
                    .map(|why| format!("{}: {why}", e.name()))
            })
            .collect();
        if reasons.is_empty() {
            reasons.push("fewer than two ranks bring a GPU".into());
        }
        let why = format!("no communicator: {}", reasons.join("; "));
        for name in NAMES {
            report.push(PHASE, name, Status::Skip, why.clone());
        }
        return;
    }
    let mut problems = Vec::new();
    let mut joined: Vec<(&Entry, &Value)> = Vec::new();
    for (seat, rank) in seated.iter().enumerate() {
        let Some(entry) = by_rank.get(rank) else {
            problems.push(format!(
                "rank {rank} (seat {seat}) sent no report, so NCCL could not finish"
            ));
            continue;
        };
        match entry.fact() {
            None => problems.push(format!("{} sent no NCCL result", entry.name())),
            Some(f) if f.get("error").is_some() => problems.push(format!(
                "{}: {}",
                entry.name(),
                f["error"].as_str().unwrap_or("failed")
            )),
            Some(f) if f.get("skipped").is_some() => problems.push(format!(
                "{} was not seated: {}",
                entry.name(),
                f["skipped"].as_str().unwrap_or("no reason given")
            )),
            Some(f) => joined.push((entry, &f["measured"])),
        }
    }
    let nodes: BTreeSet<String> = seated
        .iter()
        .filter_map(|r| by_rank.get(r))
        .map(|e| e.node())
        .collect();
    if problems.is_empty() {
        let version = joined[0].1["nccl_version"].as_str().unwrap_or("?");
        let init = joined
            .iter()
            .filter_map(|(_, m)| m["init_s"].as_f64())
            .fold(0f64, f64::max);
        let checked: u64 = joined
            .iter()
            .filter_map(|(_, m)| m["checked"].as_u64())
            .sum();
        report.push(
            PHASE,
            NAMES[0],
            Status::Pass,
            format!(
                "{} ranks on {} joined one communicator with NCCL {version} in {init:.1} s; \
                 all-reduce and all-gather gave the expected values ({checked} elements checked)",
                seated.len(),
                match nodes.len() {
                    1 => "one node".to_string(),
                    n => format!("{n} nodes"),
                }
            ),
        );
    } else {
        report.push(PHASE, NAMES[0], Status::Fail, problems.join("; "));
    }
    for (name, key) in [(NAMES[1], "all_reduce"), (NAMES[2], "all_gather")] {
        let (status, detail) = bandwidth(&joined, key, seated.len(), problems.is_empty());
        report.push(PHASE, name, status, detail);
    }
    transports(seated, &by_rank, report);
    let (status, detail) = slowest_pair(seated, &by_rank, &joined, problems.is_empty());
    report.push(PHASE, NAMES[3], status, detail);
    let (status, detail) = preset_ab(seated, &by_rank, &joined);
    report.push(
        PHASE,
        "preset vs NCCL defaults across ranks",
        status,
        detail,
    );
}

/// The all-reduce at the largest size under the preset against a second communicator with
/// every preset variable set empty (NCCL's defaults), as the single-node probe compares them.
fn preset_ab(
    seated: &[u32],
    by_rank: &BTreeMap<u32, &Entry>,
    joined: &[(&Entry, &Value)],
) -> (Status, String) {
    let defaults: Vec<(&Entry, &Value)> = seated
        .iter()
        .filter_map(|r| by_rank.get(r))
        .filter_map(|e| e.report["facts"].get(FACT_DEFAULTS).map(|f| (*e, f)))
        .collect();
    if let Some(why) = defaults
        .iter()
        .find(|(e, _)| e.rank == 0)
        .and_then(|(_, f)| f["skipped"].as_str())
    {
        return (Status::Skip, why.to_string());
    }
    if joined.len() < seated.len() {
        return (
            Status::Skip,
            "not measured: the communicator under the preset did not complete".into(),
        );
    }
    let failed: Vec<String> = defaults
        .iter()
        .filter_map(|(e, f)| {
            f.get("error")
                .or_else(|| f.get("skipped"))
                .map(|why| format!("{}: {}", e.name(), why.as_str().unwrap_or("failed")))
        })
        .collect();
    if !failed.is_empty() || defaults.len() < seated.len() {
        return (
            Status::Fail,
            format!(
                "the run under NCCL's defaults did not complete: {}",
                if failed.is_empty() {
                    "not every seated rank ran it".to_string()
                } else {
                    failed.join("; ")
                }
            ),
        );
    }
    let with: Vec<(&Entry, &Value)> = joined.to_vec();
    let without: Vec<(&Entry, &Value)> =
        defaults.iter().map(|(e, f)| (*e, &f["measured"])).collect();
    let (Some((bytes, a)), Some((_, b))) = (largest(&with), largest(&without)) else {
        return (
            Status::Fail,
            "not measured: no all-reduce time in one of the runs".into(),
        );
    };
    let names: Vec<&str> = joined[0]
        .0
        .fact()
        .map_or(&[][..], |f| {
            f["variables"].as_array().map_or(&[][..], Vec::as_slice)
        })
        .iter()
        .filter_map(|kv| kv[0].as_str())
        .filter(|k| *k != "NCCL_NVLS_ENABLE" && *k != "NCCL_HOSTID")
        .collect();
    let ratio = a / b;
    let verdict = if ratio >= 1.05 {
        "helps"
    } else if ratio >= 0.95 {
        "is neutral"
    } else {
        "hurts"
    };
    (
        if ratio >= 0.95 {
            Status::Pass
        } else {
            Status::Warn
        },
        format!(
            "all-reduce busbw at {}: {a:.1} GB/s with the preset ({}), {b:.1} with NCCL's \
             defaults: the preset {verdict} ({:+.0}%)",
            size(bytes),
            names.join(" "),
            (ratio - 1.0) * 100.0
        ),
    )
}

/// The all-reduce bus bandwidth at the largest size, from the slowest rank's time.
fn largest(measured: &[(&Entry, &Value)]) -> Option<(u64, f64)> {
    let mut worst: Option<(u64, f64, f64)> = None;
    for (_, m) in measured {
        let row = m["all_reduce"]
            .as_array()?
            .iter()
            .max_by_key(|r| r["bytes"].as_u64())?;
        let (bytes, us, busbw) = (
            row["bytes"].as_u64()?,
            row["time_us"].as_f64()?,
            row["busbw"].as_f64()?,
        );
        if worst.is_none_or(|(_, t, _)| us > t) {
            worst = Some((bytes, us, busbw));
        }
    }
    worst.map(|(bytes, _, busbw)| (bytes, busbw))
}

/// The checks' names, in order (transports come between all-gather and the slowest pair).
const NAMES: [&str; 4] = [
    "NCCL across ranks",
    "all-reduce busbw across ranks",
    "all-gather busbw across ranks",
    "slowest pair",
];

/// Bus bandwidth per size from the slowest rank's time (every rank must finish the
/// collective for it to be done).
fn bandwidth(
    joined: &[(&Entry, &Value)],
    key: &str,
    seats: usize,
    complete: bool,
) -> (Status, String) {
    if !complete {
        return (
            Status::Skip,
            "not measured: the communicator did not complete".into(),
        );
    }
    let mut slowest: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for (_, measured) in joined {
        for row in measured[key].as_array().map_or(&[][..], Vec::as_slice) {
            let (Some(bytes), Some(us), Some(busbw)) = (
                row["bytes"].as_u64(),
                row["time_us"].as_f64(),
                row["busbw"].as_f64(),
            ) else {
                continue;
            };
            let worst = slowest.entry(bytes).or_insert((us, busbw));
            if us > worst.0 {
                *worst = (us, busbw);
            }
        }
    }
    if slowest.is_empty() {
        return (Status::Fail, "not measured: no rank returned a time".into());
    }
    let sizes: Vec<String> = slowest
        .iter()
        .map(|(bytes, (us, busbw))| format!("{}: {busbw:.1} GB/s ({us:.0} us)", size(*bytes)))
        .collect();
    (
        Status::Pass,
        format!(
            "{} (nccl-tests bus bandwidth over {seats} ranks, the slowest rank's time)",
            sizes.join(", ")
        ),
    )
}

/// `1 MiB`, `256 MiB`, `4 KiB`, `3 B`.
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// One check per pair of ranks that NCCL connected, each direction with the transport it
/// logged; FAIL where a rank's preset asks for another.
fn transports(seated: &[u32], by_rank: &BTreeMap<u32, &Entry>, report: &mut Report) {
    // (sender, receiver) in world ranks -> "via" -> channels.
    let mut links: BTreeMap<(u32, u32), BTreeMap<String, BTreeSet<u32>>> = BTreeMap::new();
    let mut any_log = false;
    for rank in seated {
        let Some(fact) = by_rank.get(rank).and_then(|e| e.fact()) else {
            continue;
        };
        for link in fact["log"]["links"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
        {
            any_log = true;
            let world = |key: &str| {
                link[key]
                    .as_u64()
                    .and_then(|s| seated.get(s as usize).copied())
            };
            let (Some(from), Some(to), Some(via)) =
                (world("from_rank"), world("to_rank"), link["via"].as_str())
            else {
                continue;
            };
            let channels = link["channels"].as_array().map_or(&[][..], Vec::as_slice);
            links
                .entry((from, to))
                .or_default()
                .entry(via.to_string())
                .or_default()
                .extend(channels.iter().filter_map(|c| c.as_u64().map(|c| c as u32)));
        }
    }
    if !any_log {
        let joined = seated
            .iter()
            .filter_map(|r| by_rank.get(r))
            .any(|e| e.fact().is_some_and(|f| f.get("error").is_none()));
        report.push(
            PHASE,
            "transport",
            if joined { Status::Warn } else { Status::Skip },
            "NCCL's log named no connection between ranks, so the transport is unknown",
        );
        return;
    }
    let mut pairs: BTreeMap<(u32, u32), Vec<(u32, u32)>> = BTreeMap::new();
    for &(from, to) in links.keys() {
        pairs
            .entry((from.min(to), from.max(to)))
            .or_default()
            .push((from, to));
    }
    for ((a, b), directions) in pairs {
        let mut parts = Vec::new();
        let mut wrong = Vec::new();
        for (from, to) in directions {
            let sender = by_rank.get(&from);
            let receiver = by_rank.get(&to);
            let fact = sender.and_then(|e| e.fact());
            let same_node = match (sender, receiver) {
                (Some(s), Some(r)) => s.node() == r.node(),
                _ => false,
            };
            for (via, channels) in &links[&(from, to)] {
                let channels: Vec<u32> = channels.iter().copied().collect();
                parts.push(format!(
                    "{} -> {} via {via}{} (channels {})",
                    sender.map_or(format!("rank {from}"), |e| e.name()),
                    receiver.map_or(format!("rank {to}"), |e| e.name()),
                    path_note(via, fact),
                    ranges(&channels)
                ));
                if let Some(problem) = against_preset(via, fact, same_node) {
                    wrong.push(format!("rank {from} -> rank {to}: {problem}"));
                }
            }
        }
        let status = if wrong.is_empty() {
            Status::Pass
        } else {
            Status::Fail
        };
        let mut detail = parts.join("; ");
        if !wrong.is_empty() {
            detail = format!("{}; {detail}", wrong.join("; "));
        }
        report.push(
            PHASE,
            format!("transport rank {a} - rank {b}"),
            status,
            detail,
        );
    }
}

/// What carries a P2P link, from NCCL's topology search on the sending rank: NVLink when the
/// path between its GPUs is NVL or NVB.
fn path_note(via: &str, fact: Option<&Value>) -> String {
    if !via.starts_with("P2P") {
        return String::new();
    }
    let intra: BTreeSet<&str> = fact
        .map(|f| f["log"]["graphs"].as_array().map_or(&[][..], Vec::as_slice))
        .unwrap_or_default()
        .iter()
        .filter_map(|g| g["intra"].as_str())
        .filter(|t| *t != "LOC")
        .collect();
    if intra.iter().any(|t| matches!(*t, "NVL" | "NVB")) {
        " over NVLink".to_string()
    } else if let Some(t) = intra.iter().next() {
        format!(" over PCIe (NCCL's path type {t})")
    } else {
        String::new()
    }
}

/// Why a link's transport is not what the sending rank's preset asks for, if it is not.
fn against_preset(via: &str, fact: Option<&Value>, same_node: bool) -> Option<String> {
    let fact = fact?;
    if let (Some(net), Some(used)) = (fact["expects_net"].as_str(), via.strip_prefix("NET/")) {
        let used = used.split('/').next().unwrap_or(used);
        if !used.eq_ignore_ascii_case(net) {
            return Some(format!(
                "the preset sets NCCL_NET={net}, yet NCCL sent over NET/{used}"
            ));
        }
    }
    if same_node
        && !via.starts_with("P2P")
        && let Some(why) = fact["expects_nvlink"].as_str()
    {
        return Some(format!(
            "{why} expects NVLink P2P within a node, yet NCCL used {via}"
        ));
    }
    None
}

/// The slowest directed pair of the send/receive shifts, against the median of all pairs.
fn slowest_pair(
    seated: &[u32],
    by_rank: &BTreeMap<u32, &Entry>,
    joined: &[(&Entry, &Value)],
    complete: bool,
) -> (Status, String) {
    if !complete {
        return (
            Status::Skip,
            "not measured: the communicator did not complete".into(),
        );
    }
    let mut pairs: Vec<(f64, u32, u32, u64)> = Vec::new();
    for (entry, measured) in joined {
        for p in measured["pairs"].as_array().map_or(&[][..], Vec::as_slice) {
            let to = p["to"]
                .as_u64()
                .and_then(|s| seated.get(s as usize).copied());
            if let (Some(to), Some(gbps), Some(bytes)) =
                (to, p["gbps"].as_f64(), p["bytes"].as_u64())
            {
                pairs.push((gbps, entry.rank, to, bytes));
            }
        }
    }
    if pairs.is_empty() {
        return (Status::Fail, "not measured: no rank returned a pair".into());
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let name = |rank: u32| {
        by_rank
            .get(&rank)
            .map_or(format!("rank {rank}"), |e| e.name())
    };
    let (slow, from, to, bytes) = pairs[0];
    let (fast, fast_from, fast_to, _) = pairs[pairs.len() - 1];
    let median = pairs[pairs.len() / 2].0;
    // Half the median: a link that slow is a fault (a lane down, a wrong route), not noise.
    let status = if slow < median / 2.0 {
        Status::Warn
    } else {
        Status::Pass
    };
    (
        status,
        format!(
            "{} -> {}: {slow:.1} GB/s per {} send, the slowest of {} directed pairs (median \
             {median:.1}, fastest {} -> {} at {fast:.1} GB/s)",
            name(from),
            name(to),
            size(bytes),
            pairs.len(),
            name(fast_from),
            name(fast_to)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::nccl_log::NcclLog;
    use serde_json::json;

    /// A rank's report as it travels, with NCCL's log read from `log` and `pairs` as
    /// (to seat, GB/s).
    fn rank_report(seat: u32, hostid: Option<&str>, net: Option<&str>, log: &str) -> Value {
        let pairs: Vec<Value> = [(1 - seat.min(1), 10.0 + f64::from(seat))]
            .iter()
            .map(|(to, gbps)| json!({"to": to, "bytes": 64 << 20, "time_us": 1.0, "gbps": gbps}))
            .collect();
        json!({"facts": {FACT: {
            "seat": {"seat": seat, "seats": 2, "budget_s": 60},
            "hostid": hostid,
            "expects_net": net,
            "expects_nvlink": null,
            "measured": {
                "nccl_version": "2.28.9", "init_s": 0.8, "checked": 100,
                "all_reduce": [{"bytes": 1048576, "time_us": 100.0 + f64::from(seat), "algbw": 1.0, "busbw": 10.0 - f64::from(seat)}],
                "all_gather": [{"bytes": 1048576, "time_us": 90.0, "algbw": 1.0, "busbw": 5.0}],
                "pairs": pairs,
            },
                        "variables": [["NCCL_SOCKET_NTHREADS", "4"], ["NCCL_NVLS_ENABLE", "0"]],
            "log": NcclLog::parse(log),
        },
        FACT_DEFAULTS: {"skipped": "the image sets no NCCL variable to compare"}}})
    }

    /// `report` with a run under NCCL's defaults whose all-reduce took `us` microseconds
    /// for `busbw` GB/s.
    fn with_defaults(mut report: Value, us: f64, busbw: f64) -> Value {
        report["facts"][FACT_DEFAULTS] = json!({"measured": {
            "all_reduce": [{"bytes": 1048576, "time_us": us, "algbw": 1.0, "busbw": busbw}],
        }});
        report
    }

    fn judge(reports: &[Value]) -> Report {
        let entries: Vec<Entry> = reports
            .iter()
            .enumerate()
            .map(|(r, report)| Entry {
                rank: r as u32,
                host: "h200",
                report,
            })
            .collect();
        let mut report = Report::default();
        checks(&[0, 1], &entries, &mut report);
        report
    }

    fn check<'a>(report: &'a Report, name: &str) -> &'a crate::probe::report::Check {
        report
            .checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name}: {}", report.to_text()))
    }

    // Recorded on two H200s by benches/h200-world.sh: one rank per GPU, as one node and as
    // two (NCCL_HOSTID differing), NCCL 2.28.9 from PyTorch's wheel.
    const SOCKET: &str =
        include_str!("../../../tests/fixtures/nccl-logs/world-h200x2-two-nodes-rank0-2.28.9.log");
    const SOCKET_1: &str =
        include_str!("../../../tests/fixtures/nccl-logs/world-h200x2-two-nodes-rank1-2.28.9.log");
    const NVLINK: &str =
        include_str!("../../../tests/fixtures/nccl-logs/world-h200x2-one-node-rank0-2.28.9.log");
    const NVLINK_1: &str =
        include_str!("../../../tests/fixtures/nccl-logs/world-h200x2-one-node-rank1-2.28.9.log");

    #[test]
    fn two_nodes_over_sockets_name_the_transport_both_ways() {
        let report = judge(&[
            rank_report(0, Some("a"), None, SOCKET),
            rank_report(1, Some("b"), None, SOCKET_1),
        ]);
        let across = check(&report, "NCCL across ranks");
        assert_eq!(across.status, Status::Pass, "{}", across.detail);
        assert!(
            across.detail.contains("2 ranks on 2 nodes"),
            "{}",
            across.detail
        );
        let t = check(&report, "transport rank 0 - rank 1");
        assert_eq!(t.status, Status::Pass, "{}", t.detail);
        assert!(
            t.detail
                .contains("rank 0 (h200) -> rank 1 (h200) via NET/Socket/0 (channels 0-1)")
                && t.detail
                    .contains("rank 1 (h200) -> rank 0 (h200) via NET/Socket/0 (channels 0-1)")
                && !t.detail.contains("P2P"),
            "{}",
            t.detail
        );
        // The slowest rank's time counts: rank 1 took 101 us.
        let ar = check(&report, "all-reduce busbw across ranks");
        assert!(
            ar.detail.starts_with("1 MiB: 9.0 GB/s (101 us)"),
            "{}",
            ar.detail
        );
        let slow = check(&report, "slowest pair");
        assert!(
            slow.detail
                .starts_with("rank 0 (h200) -> rank 1 (h200): 10.0 GB/s per 64 MiB"),
            "{}",
            slow.detail
        );
    }

    #[test]
    fn an_ib_preset_on_sockets_fails_naming_the_pair() {
        let report = judge(&[
            rank_report(0, Some("a"), Some("IB"), SOCKET),
            rank_report(1, Some("b"), Some("IB"), SOCKET_1),
        ]);
        let t = check(&report, "transport rank 0 - rank 1");
        assert_eq!(t.status, Status::Fail);
        assert!(
            t.detail.starts_with(
                "rank 0 -> rank 1: the preset sets NCCL_NET=IB, yet NCCL sent over NET/Socket"
            ),
            "{}",
            t.detail
        );
        assert_eq!(report.exit_code(), 1);
    }

    #[test]
    fn one_node_over_nvlink_says_so() {
        let report = judge(&[
            rank_report(0, None, Some("IB"), NVLINK),
            rank_report(1, None, None, NVLINK_1),
        ]);
        let t = check(&report, "transport rank 0 - rank 1");
        // P2P within a node is no network: NCCL_NET does not apply to it.
        assert_eq!(t.status, Status::Pass, "{}", t.detail);
        assert!(
            t.detail
                .contains("rank 0 (h200) -> rank 1 (h200) via P2P/CUMEM over NVLink")
                && t.detail
                    .contains("rank 1 (h200) -> rank 0 (h200) via P2P/CUMEM over NVLink"),
            "{}",
            t.detail
        );
        assert!(
            check(&report, "NCCL across ranks")
                .detail
                .contains("2 ranks on one node joined")
        );
    }

    #[test]
    fn a_rank_that_failed_in_nccl_is_named_and_nothing_is_measured() {
        let mut failed = rank_report(1, None, None, "");
        failed["facts"][FACT]["error"] =
            json!("ncclCommInitRankConfig still in progress at the deadline: aborted");
        let report = judge(&[rank_report(0, None, None, SOCKET), failed]);
        let across = check(&report, "NCCL across ranks");
        assert_eq!(across.status, Status::Fail);
        assert!(
            across
                .detail
                .starts_with("rank 1 (h200): ncclCommInitRankConfig"),
            "{}",
            across.detail
        );
        assert_eq!(
            check(&report, "all-reduce busbw across ranks").status,
            Status::Skip
        );
        assert_eq!(check(&report, "slowest pair").status, Status::Skip);
        assert_eq!(
            check(&report, "preset vs NCCL defaults across ranks").status,
            Status::Skip
        );

        // A seated rank that never reported is named too.
        let entries = [Entry {
            rank: 0,
            host: "h",
            report: &rank_report(0, None, None, SOCKET),
        }];
        let mut report = Report::default();
        checks(&[0, 2], &entries, &mut report);
        assert!(
            check(&report, "NCCL across ranks")
                .detail
                .contains("rank 2 (seat 1) sent no report")
        );
    }

    #[test]
    fn without_a_communicator_every_row_skips_with_the_reasons() {
        let r0 = json!({"facts": {FACT: {"skipped": "no GPU on this node (local exit 3)"}}});
        let r1 = json!({"facts": {}});
        let entries = [
            Entry {
                rank: 0,
                host: "a",
                report: &r0,
            },
            Entry {
                rank: 1,
                host: "b",
                report: &r1,
            },
        ];
        let mut report = Report::default();
        checks(&[], &entries, &mut report);
        assert_eq!(report.checks.len(), NAMES.len());
        for c in &report.checks {
            assert_eq!(c.status, Status::Skip);
            assert_eq!(
                c.detail,
                "no communicator: rank 0 (a): no GPU on this node (local exit 3)"
            );
        }
    }

    #[test]
    fn a_slow_link_warns() {
        let mut slow = rank_report(1, Some("b"), None, SOCKET_1);
        slow["facts"][FACT]["measured"]["pairs"][0]["gbps"] = json!(2.0);
        let report = judge(&[rank_report(0, Some("a"), None, SOCKET), slow]);
        let c = check(&report, "slowest pair");
        assert_eq!(c.status, Status::Warn, "{}", c.detail);
        assert!(
            c.detail
                .starts_with("rank 1 (h200) -> rank 0 (h200): 2.0 GB/s"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn nvlink_expected_within_a_node_and_sockets_found_fails() {
        let mut r0 = rank_report(0, None, None, SOCKET);
        r0["facts"][FACT]["expects_nvlink"] = json!("NCCL_P2P_LEVEL=NVL");
        // No NCCL_HOSTID: both ranks on host h200, one node, yet NCCL went through sockets.
        let report = judge(&[r0, rank_report(1, None, None, SOCKET_1)]);
        let t = check(&report, "transport rank 0 - rank 1");
        assert_eq!(t.status, Status::Fail);
        assert!(
            t.detail.starts_with(
                "rank 0 -> rank 1: NCCL_P2P_LEVEL=NVL expects NVLink P2P within a node, yet NCCL used NET/Socket/0"
            ),
            "{}",
            t.detail
        );
        // Across nodes the same sockets are no breach of an NVLink expectation.
        let mut r0 = rank_report(0, Some("a"), None, SOCKET);
        r0["facts"][FACT]["expects_nvlink"] = json!("NCCL_P2P_LEVEL=NVL");
        let report = judge(&[r0, rank_report(1, Some("b"), None, SOCKET_1)]);
        assert_eq!(
            check(&report, "transport rank 0 - rank 1").status,
            Status::Pass
        );
    }

    #[test]
    fn a_peer_that_never_joined_leaves_no_link_in_the_log() {
        let log = NcclLog::parse(include_str!(
            "../../../tests/fixtures/nccl-logs/world-h200x2-dead-rank-rank0-2.28.9.log"
        ));
        assert!(log.links.is_empty());
        assert_eq!(log.network.as_deref(), Some("Socket"));
        assert!(
            log.warnings
                .iter()
                .any(|w| w.contains("ncclAsyncJobComplete")),
            "{:?}",
            log.warnings
        );
    }

    #[test]
    fn the_preset_is_compared_with_nccl_defaults_across_ranks() {
        let name = "preset vs NCCL defaults across ranks";
        // Without preset variables rank 0 ran no second communicator, and says so.
        let report = judge(&[
            rank_report(0, Some("a"), None, SOCKET),
            rank_report(1, Some("b"), None, SOCKET_1),
        ]);
        let c = check(&report, name);
        assert_eq!(
            (c.status, c.detail.as_str()),
            (Status::Skip, "the image sets no NCCL variable to compare")
        );

        // Under the preset the slowest rank gave 9 GB/s; under the defaults 6: it helps.
        let report = judge(&[
            with_defaults(rank_report(0, Some("a"), None, SOCKET), 150.0, 6.5),
            with_defaults(rank_report(1, Some("b"), None, SOCKET_1), 160.0, 6.0),
        ]);
        let c = check(&report, name);
        assert_eq!(c.status, Status::Pass, "{}", c.detail);
        assert_eq!(
            c.detail,
            "all-reduce busbw at 1 MiB: 9.0 GB/s with the preset (NCCL_SOCKET_NTHREADS), 6.0 with \
             NCCL's defaults: the preset helps (+50%)"
        );

        // The preset slower than NCCL's defaults warns.
        let report = judge(&[
            with_defaults(rank_report(0, Some("a"), None, SOCKET), 50.0, 20.0),
            with_defaults(rank_report(1, Some("b"), None, SOCKET_1), 50.0, 20.0),
        ]);
        let c = check(&report, name);
        assert_eq!(c.status, Status::Warn, "{}", c.detail);
        assert!(
            c.detail.ends_with("the preset hurts (-55%)"),
            "{}",
            c.detail
        );

        // A rank whose second run failed is named.
        let mut broken = rank_report(1, Some("b"), None, SOCKET_1);
        broken["facts"][FACT_DEFAULTS] = json!({"error": "held until the deadline"});
        let report = judge(&[
            with_defaults(rank_report(0, Some("a"), None, SOCKET), 50.0, 20.0),
            broken,
        ]);
        let c = check(&report, name);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("rank 1 (h200): held until the deadline"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(1 << 20), "1 MiB");
        assert_eq!(size(256 << 20), "256 MiB");
        assert_eq!(size(1536), "1536 B");
        assert_eq!(size(3 << 30), "3 GiB");
    }
}
