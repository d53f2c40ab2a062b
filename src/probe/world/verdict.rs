//! Rank 0's verdict on the world, as one report with a single phase: a check per rank (its
//! host and local verdict, or why it is absent), the broadcast, NCCL across the ranks (see
//! `judge`), and a summary. It exits 3 only when every rank reported and none has a GPU,
//! as a single node's probe does; a node without a GPU among nodes with one is a failure.

use super::place::Place;
use super::rendezvous::{Gathered, Outcome};
use crate::probe::report::{Report, Status, Verdict};
use serde_json::{Value, json};
use std::time::Duration;

/// The phase of every check here.
pub const PHASE: &str = "world";

/// How rank 0 ran the rendezvous.
pub struct Setting<'a> {
    /// Rank 0's place.
    pub place: &'a Place,
    /// The port it listened on.
    pub port: u16,
    /// The deadline of each step.
    pub timeout: Duration,
    /// sha256 of the blob it sent, hex.
    pub blob_sha256: &'a str,
    /// The world rank of each seat in the communicator across ranks; empty without one.
    pub seated: &'a [u32],
}

/// The world's report. `gathered.outcomes` holds every rank, rank 0 included.
pub fn verdict(setting: &Setting, gathered: &Gathered) -> Report {
    let mut report = Report {
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        ..Report::default()
    };
    let secs = setting.timeout.as_secs();
    let mut tally = Tally::default();
    for (rank, outcome) in &gathered.outcomes {
        let (status, detail) = match outcome {
            Outcome::Reported {
                peer,
                exit_code,
                blob_sha256,
                report: local,
            } => {
                tally.reported += 1;
                if blob_sha256 != setting.blob_sha256 {
                    tally.other_blob.push(*rank);
                }
                let (status, verdict) = local_verdict(*exit_code, local);
                match Verdict::of_exit_code((*exit_code).into()) {
                    Some(Verdict::Pass) => {}
                    Some(Verdict::Lacking) => tally.no_gpu.push(*rank),
                    _ => tally.failed.push(*rank),
                }
                (status, format!("{peer}: {verdict}"))
            }
            Outcome::Missing { refused } => {
                tally.missing.push(*rank);
                let why = match refused {
                    Some(reason) => format!("its hello was refused: {reason}"),
                    None => format!("no hello within {secs} s"),
                };
                (Status::Fail, format!("missing: {why}"))
            }
            Outcome::Dead { peer } => {
                tally.dead.push(*rank);
                (
                    Status::Fail,
                    format!(
                        "dead: {peer} said hello, then its connection closed before its \
                         report (the process died or was killed)"
                    ),
                )
            }
            Outcome::Slow { peer } => {
                tally.slow.push(*rank);
                (
                    Status::Fail,
                    format!(
                        "slow: {peer} said hello but sent no report within {secs} s of \
                         the broadcast"
                    ),
                )
            }
            Outcome::Broken { peer, problem } => {
                tally.broken.push(*rank);
                (Status::Fail, format!("{peer}: {problem}"))
            }
        };
        report.push(PHASE, format!("rank {rank}"), status, detail);
    }
    broadcast_check(setting, &tally, &mut report);
    if !gathered.refused.is_empty() {
        report.push(
            PHASE,
            "refused hellos",
            Status::Fail,
            gathered.refused.join("; "),
        );
    }
    if !gathered.ignored.is_empty() {
        report.push(
            PHASE,
            "ignored connections",
            Status::Warn,
            gathered.ignored.join("; "),
        );
    }
    let entries: Vec<super::judge::Entry> = gathered
        .outcomes
        .iter()
        .filter_map(|(rank, outcome)| match outcome {
            Outcome::Reported { peer, report, .. } => Some(super::judge::Entry {
                rank: *rank,
                host: &peer.host,
                report,
            }),
            _ => None,
        })
        .collect();
    super::judge::checks(setting.seated, &entries, &mut report);
    let world_size = setting.place.world_size as usize;
    let clean = gathered.refused.is_empty() && tally.other_blob.is_empty();
    report.no_gpu = clean && tally.no_gpu.len() == world_size;
    let all_passed = clean
        && tally.reported == world_size
        && tally.failed_ranks() == 0
        && tally.no_gpu.is_empty();
    report.push(
        PHASE,
        "world",
        if all_passed {
            Status::Pass
        } else {
            Status::Fail
        },
        tally.summary(setting),
    );
    report.fact(PHASE, facts(setting, gathered));
    report
}

/// The ranks in each state.
#[derive(Default)]
struct Tally {
    reported: usize,
    missing: Vec<u32>,
    dead: Vec<u32>,
    slow: Vec<u32>,
    broken: Vec<u32>,
    failed: Vec<u32>,
    no_gpu: Vec<u32>,
    other_blob: Vec<u32>,
}

impl Tally {
    fn failed_ranks(&self) -> usize {
        self.missing.len()
            + self.dead.len()
            + self.slow.len()
            + self.broken.len()
            + self.failed.len()
    }

    fn summary(&self, setting: &Setting) -> String {
        let place = setting.place;
        let mut text = format!(
            "{} of {} ranks reported (launched by {}; rank 0 on {}, port {})",
            self.reported, place.world_size, place.launcher, place.node, setting.port
        );
        for (what, ranks) in [
            ("missing", &self.missing),
            ("dead", &self.dead),
            ("slow", &self.slow),
            ("broken", &self.broken),
            ("failed locally", &self.failed),
            ("no GPU", &self.no_gpu),
            ("received other bytes", &self.other_blob),
        ] {
            if !ranks.is_empty() {
                text.push_str(&format!("; {what}: {}", list(ranks)));
            }
        }
        text
    }
}

fn broadcast_check(setting: &Setting, tally: &Tally, report: &mut Report) {
    let (status, detail) = if tally.reported == 0 {
        (Status::Skip, "no rank reported".to_string())
    } else if tally.other_blob.is_empty() {
        (
            Status::Pass,
            format!(
                "all {} reporting ranks received rank 0's blob intact (sha256 {})",
                tally.reported,
                &setting.blob_sha256[..12.min(setting.blob_sha256.len())]
            ),
        )
    } else {
        (
            Status::Fail,
            format!(
                "ranks {} received bytes other than rank 0 sent",
                list(&tally.other_blob)
            ),
        )
    };
    report.push(PHASE, "broadcast", status, detail);
}

/// A rank's own verdict in a line: its counts, or what failed.
fn local_verdict(exit_code: i32, local: &Value) -> (Status, String) {
    let checks: &[Value] = local["checks"].as_array().map_or(&[], Vec::as_slice);
    let count = |s: &str| checks.iter().filter(|c| c["status"] == s).count();
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c["status"] == "FAIL")
        .filter_map(|c| c["name"].as_str())
        .collect();
    let shown = failed
        .iter()
        .take(4)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    let more = match failed.len() {
        0..=4 => String::new(),
        n => format!(" and {} more", n - 4),
    };
    match Verdict::of_exit_code(exit_code.into()) {
        Some(Verdict::Pass) => (
            Status::Pass,
            format!(
                "passed locally ({} passed, {} warned, {} skipped)",
                count("PASS"),
                count("WARN"),
                count("SKIP")
            ),
        ),
        Some(Verdict::Lacking) => (
            Status::Fail,
            "no GPU (local exit 3); its report is in the JSON".to_string(),
        ),
        _ if failed.is_empty() => (Status::Fail, format!("local exit {exit_code}")),
        _ => (
            Status::Fail,
            format!("local exit {exit_code}; failed: {shown}{more}"),
        ),
    }
}

/// `1, 2, 5`.
fn list(ranks: &[u32]) -> String {
    ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The whole world for the JSON report: the setting and every rank with its own report.
fn facts(setting: &Setting, gathered: &Gathered) -> Value {
    let ranks: Vec<Value> = gathered
        .outcomes
        .iter()
        .map(|(rank, outcome)| {
            let mut entry = serde_json::to_value(outcome).unwrap_or(Value::Null);
            if let Some(fields) = entry.as_object_mut() {
                fields.insert("rank".into(), json!(rank));
            }
            entry
        })
        .collect();
    json!({
        "place": setting.place,
        "port": setting.port,
        "timeout_s": setting.timeout.as_secs(),
        "blob_sha256": setting.blob_sha256,
        "ranks": ranks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::world::place::Launcher;
    use crate::probe::world::rendezvous::Peer;

    fn place(world_size: u32) -> Place {
        Place {
            rank: 0,
            world_size,
            local_rank: 0,
            local_world_size: None,
            node: "node-a".into(),
            master_addr: "node-a".into(),
            master_port: Some(29500),
            job: None,
            launcher: Launcher::Torchrun,
        }
    }

    fn reported(rank: u32, exit_code: i32, blob: &str) -> Outcome {
        let status = if exit_code == 0 { "PASS" } else { "FAIL" };
        Outcome::Reported {
            peer: Peer {
                host: format!("node-{rank}"),
                pid: 100 + rank,
                address: format!("10.0.0.{rank}"),
            },
            exit_code,
            blob_sha256: blob.into(),
            report: json!({"checks": [{"name": "GPU 0 PCIe link", "status": status}]}),
        }
    }

    fn judge(outcomes: Vec<Outcome>) -> Report {
        let place = place(outcomes.len() as u32);
        let gathered = Gathered {
            outcomes: (0..).zip(outcomes).collect(),
            ..Gathered::default()
        };
        verdict(
            &Setting {
                place: &place,
                port: 29501,
                timeout: Duration::from_secs(9),
                blob_sha256: "abc",
                seated: &[],
            },
            &gathered,
        )
    }

    fn check<'a>(report: &'a Report, name: &str) -> &'a crate::probe::report::Check {
        report.checks.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn every_rank_passing_passes() {
        let report = judge(vec![reported(0, 0, "abc"), reported(1, 0, "abc")]);
        assert_eq!(report.exit_code(), 0, "{}", report.to_text());
        assert!(
            check(&report, "rank 1")
                .detail
                .contains("node-1 (10.0.0.1) pid 101")
        );
        assert_eq!(check(&report, "NCCL across ranks").status, Status::Skip);
        assert_eq!(check(&report, "broadcast").status, Status::Pass);
    }

    #[test]
    fn no_gpu_anywhere_is_exit_3_and_somewhere_is_a_failure() {
        let none = judge(vec![reported(0, 3, "abc"), reported(1, 3, "abc")]);
        assert_eq!(none.exit_code(), 3, "{}", none.to_text());
        assert!(check(&none, "world").detail.contains("no GPU: 0, 1"));

        let one = judge(vec![reported(0, 0, "abc"), reported(1, 3, "abc")]);
        assert_eq!(one.exit_code(), 1);

        // A missing rank is a failure even where the others lack GPUs.
        let missing = judge(vec![
            reported(0, 3, "abc"),
            Outcome::Missing { refused: None },
        ]);
        assert_eq!(missing.exit_code(), 1);
    }

    #[test]
    fn absent_ranks_are_named_with_what_stopped_them() {
        let peer = |rank: u32| Peer {
            host: format!("node-{rank}"),
            pid: 7,
            address: format!("10.0.0.{rank}"),
        };
        let report = judge(vec![
            reported(0, 0, "abc"),
            reported(1, 1, "abc"),
            Outcome::Missing {
                refused: Some("believes the world has 9 ranks".into()),
            },
            Outcome::Dead { peer: peer(3) },
            Outcome::Slow { peer: peer(4) },
            Outcome::Broken {
                peer: peer(5),
                problem: "not JSON".into(),
            },
            reported(6, 0, "xyz"),
        ]);
        assert_eq!(report.exit_code(), 1);
        assert!(
            check(&report, "rank 1")
                .detail
                .contains("failed: GPU 0 PCIe link")
        );
        assert!(check(&report, "rank 2").detail.contains("9 ranks"));
        assert!(check(&report, "rank 3").detail.starts_with("dead: node-3"));
        assert!(check(&report, "rank 4").detail.contains("within 9 s"));
        assert!(check(&report, "rank 5").detail.contains("not JSON"));
        assert_eq!(check(&report, "broadcast").status, Status::Fail);
        let summary = &check(&report, "world").detail;
        assert!(
            summary.starts_with("3 of 7 ranks reported")
                && summary.contains("missing: 2; dead: 3; slow: 4; broken: 5; failed locally: 1")
                && summary.contains("received other bytes: 6"),
            "{summary}"
        );
        let facts = &report.facts["world"]["ranks"];
        assert_eq!(facts[3]["state"], "dead");
        assert_eq!(facts[3]["rank"], 3);
        assert_eq!(facts[1]["report"]["checks"][0]["status"], "FAIL");
    }

    #[test]
    fn a_report_without_checks_is_still_judged() {
        let odd = Outcome::Reported {
            peer: Peer {
                host: "h".into(),
                pid: 1,
                address: "10.0.0.9".into(),
            },
            exit_code: 2,
            blob_sha256: "abc".into(),
            report: json!("not an object"),
        };
        let report = judge(vec![reported(0, 0, "abc"), odd]);
        assert_eq!(
            check(&report, "rank 1").detail,
            "h (10.0.0.9) pid 1: local exit 2"
        );
    }
}
