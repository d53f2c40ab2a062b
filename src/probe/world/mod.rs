//! `gpubake probe --world`: the probe on every node of a multi-node run, started by the
//! launcher the cluster already uses (torchrun `--no-python`, srun, mpirun, a PyTorchJob or
//! JobSet). Each rank probes its own node, then joins a small rendezvous that rank 0 runs on
//! a port of its own (never the launcher's `MASTER_PORT`); rank 0 gathers every report and
//! gives one verdict, naming each rank that is missing, died or was too slow.
//!
//! Ranks with a GPU then meet in NCCL: rank 0's NCCL worker makes the unique id, the
//! rendezvous broadcasts it with each rank's seat, and every seated rank's worker joins the
//! communicator, measures, and reads the transport to each peer from NCCL's log. Where
//! the image's preset sets NCCL variables they meet a second time with those set empty,
//! for the preset against NCCL's defaults. The verdict judges them all together.

pub mod collectives;
pub mod hostlist;
pub mod judge;
mod launchers;
pub mod nccl;
pub mod place;
pub mod rendezvous;
pub mod verdict;
pub mod wire;

use super::env::Discovery;
use super::report::{Report, Status};
use crate::error::Error;
use place::Place;
use rendezvous::{Broadcast, Contribution, Outcome, Peer, Rehearsal};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How to run the rendezvous.
#[derive(Clone, Debug)]
pub struct WorldOptions {
    /// The port rank 0 listens on, instead of `MASTER_PORT` + 1.
    pub port: Option<u16>,
    /// The deadline of each step: reaching rank 0, every hello, NCCL, every report.
    pub timeout: Duration,
    /// Where to keep NCCL's log of the run across ranks.
    pub nccl_log: Option<std::path::PathBuf>,
}

/// The bytes rank 0 broadcasts without a communicator: as long as NCCL's unique id.
const BLOB_BYTES: usize = collectives::ID_BYTES;

/// Probes this node, then joins the world. Rank 0 returns the world's verdict; every other
/// rank its own report with one more check saying whether rank 0 counted it.
pub fn run(opts: &super::ProbeOptions, world: &WorldOptions) -> crate::Result<Report> {
    let start = Instant::now();
    // Variables that are not UTF-8 belong to no launcher; reading them must not panic.
    let env: HashMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let place =
        Place::from_env(&env, &hostname()).map_err(|e| Error::Usage(format!("--world: {e}")))?;
    let port = place
        .world_port(world.port)
        .map_err(|e| Error::Usage(format!("--world: {e}")))?;
    // Made before the probe, so a directory that cannot be written fails in a second, not
    // after minutes of measuring; and so it exists even when no run of NCCL fills it.
    if let Some(dir) = &world.nccl_log {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Usage(format!("--world-nccl-log {}: {e}", dir.display())))?;
    }
    eprintln!(
        "gpubake: rank {} of {} on {} (launched by {}); rank 0 at {}:{port}",
        place.rank, place.world_size, place.node, place.launcher, place.master_addr
    );

    let (mut local, local_error) = match super::run(opts) {
        Ok(report) => (report, None),
        Err(e) => (could_not_probe(&e), Some(e)),
    };
    let exit_code = local_error
        .as_ref()
        .map_or_else(|| local.exit_code(), Error::exit_code);
    let disc = Discovery::system();
    let cuda_visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let gpu = nccl::gpu_for(
        &local,
        place.local_rank,
        !disc.nccl_candidates().is_empty(),
        cuda_visible.as_deref(),
    );
    let joining = Joining {
        disc: &disc,
        gpu: &gpu,
        quick: opts.quick,
        budget: world.timeout,
        keep_log: world
            .nccl_log
            .as_ref()
            .map(|dir| dir.join(format!("nccl-rank{}", place.rank))),
    };

    if place.rank == 0 {
        let mut report = lead(&place, port, world.timeout, local, exit_code, &joining);
        report.seconds = start.elapsed().as_secs_f64();
        return Ok(report);
    }
    let contribute = |welcomed: &rendezvous::Welcomed| {
        let (first, second) = joining.follow(welcomed);
        joining.say_unkept(&first, &second);
        local.fact(nccl::FACT, first);
        local.fact(nccl::FACT_DEFAULTS, second);
        Contribution {
            exit_code,
            report: serde_json::to_value(&local).unwrap_or_default(),
        }
    };
    let outcome = rendezvous::follow(
        &place,
        port,
        world.timeout,
        gpu.is_ok(),
        contribute,
        rehearsal(&env),
    );
    match outcome {
        Ok(counted) => local.push(verdict::PHASE, "rendezvous", Status::Pass, counted),
        Err(why) => local.push(verdict::PHASE, "rendezvous", Status::Fail, why),
    }
    local.seconds = start.elapsed().as_secs_f64();
    match local_error {
        Some(e) => Err(e),
        None => Ok(local),
    }
}

/// What a rank needs to join NCCL across ranks.
struct Joining<'a> {
    disc: &'a Discovery,
    /// This rank's GPU by PCI address, or why it brings none.
    gpu: &'a Result<String, String>,
    quick: bool,
    /// The deadline of NCCL's step, as of every other step.
    budget: Duration,
    /// Where NCCL's log is kept: a directory and this rank's file prefix.
    keep_log: Option<std::path::PathBuf>,
}

/// This rank's two facts: NCCL under the preset, and under NCCL's defaults.
type Facts = (serde_json::Value, serde_json::Value);

impl Joining<'_> {
    /// Runs one seat: the worker, waited for; its fact, or an error fact saying why it did
    /// not start.
    fn run(&self, seat: nccl::Seat, gpu: &str, id: &[u8], phase: nccl::Phase) -> serde_json::Value {
        match nccl::start(self.disc, seat, gpu, Some(id), self.quick, phase, false) {
            Ok(running) => running.finish(self.keep_log(phase).as_deref()),
            Err(e) => json!({"seat": seat, "error": e}),
        }
    }

    /// Where this run's NCCL log is kept: `nccl-rank3` and `nccl-defaults-rank3`.
    fn keep_log(&self, phase: nccl::Phase) -> Option<std::path::PathBuf> {
        let prefix = self.keep_log.as_ref()?;
        match phase {
            nccl::Phase::Preset => Some(prefix.clone()),
            nccl::Phase::Defaults => {
                let name =
                    prefix
                        .file_name()?
                        .to_string_lossy()
                        .replacen("nccl-", "nccl-defaults-", 1);
                Some(prefix.with_file_name(name))
            }
        }
    }

    /// Says on standard error why a run of NCCL left nothing in `--world-nccl-log`: it never
    /// ran on this rank (no GPU, no seat, no second run) or its worker did not start. A run
    /// whose worker ran says so itself when NCCL wrote no log (`nccl::Running::finish`).
    fn say_unkept(&self, first: &serde_json::Value, second: &serde_json::Value) {
        let Some(prefix) = &self.keep_log else {
            return;
        };
        let runs = [
            ("the run under the preset", first),
            ("the run under NCCL's defaults", second),
        ];
        for (run, fact) in runs {
            let why = match (fact["skipped"].as_str(), fact.get("log")) {
                (Some(why), _) => why,
                // A worker that ran has a parsed log, even an empty one.
                (None, None) => fact["error"].as_str().unwrap_or("its worker did not start"),
                (None, Some(_)) => continue,
            };
            eprintln!(
                "gpubake: --world-nccl-log: no NCCL log as {} from {run}: {why}",
                prefix.display()
            );
        }
    }

    /// A rank other than 0: runs its seat (and the run under NCCL's defaults after it, when
    /// rank 0 sent a second id), or says why it has none.
    fn follow(&self, welcomed: &rendezvous::Welcomed) -> Facts {
        let no_second =
            || nccl::skipped("rank 0 sent no second id: the preset sets no NCCL variable");
        match (welcomed.seat, self.gpu) {
            (Some(seat), Ok(gpu)) => {
                let first = self.run(seat, gpu, &welcomed.blob, nccl::Phase::Preset);
                let second = match &welcomed.second {
                    Some(id) => self.run(seat, gpu, id, nccl::Phase::Defaults),
                    None => no_second(),
                };
                (first, second)
            }
            (Some(seat), Err(why)) => (json!({"seat": seat, "error": why}), no_second()),
            (None, Err(why)) => (nccl::skipped(why), nccl::skipped(why)),
            (None, Ok(_)) => {
                let why =
                    "rank 0 gave this rank no seat: rank 0 has no GPU, or no other rank has one";
                (nccl::skipped(why), nccl::skipped(why))
            }
        }
    }

    /// Rank 0: seats the ranks with a GPU and starts its own workers, which make NCCL's
    /// unique ids: the run under the preset, and (when the preset sets variables) a second
    /// run under NCCL's defaults that joins once the first has ended. Returns what to
    /// broadcast, the seating, and a thread that waits for both workers.
    fn lead(&self, others_with_gpu: &[u32]) -> (Broadcast, Vec<u32>, JoinHandle<Facts>) {
        let plain = Broadcast {
            blob: blob(),
            ..Broadcast::default()
        };
        let done = |facts: Facts| std::thread::spawn(move || facts);
        let seated = nccl::seating(self.gpu.is_ok(), others_with_gpu);
        let gpu = match (self.gpu, seated.is_empty()) {
            (Err(why), _) => {
                return (
                    plain,
                    seated,
                    done((nccl::skipped(why), nccl::skipped(why))),
                );
            }
            (Ok(_), true) => {
                let why = "no other rank brings a GPU";
                return (
                    plain,
                    seated,
                    done((nccl::skipped(why), nccl::skipped(why))),
                );
            }
            (Ok(gpu), false) => gpu,
        };
        let seats: std::collections::BTreeMap<u32, nccl::Seat> = (0..)
            .zip(&seated)
            .map(|(seat, rank)| {
                let seat = nccl::Seat {
                    seat,
                    seats: seated.len() as u32,
                    budget_s: self.budget.as_secs(),
                };
                (*rank, seat)
            })
            .collect();
        let mine = seats[&0];
        let compare = !nccl::compared(&crate::probe::image_preset(self.disc)).is_empty();
        let within = Duration::from_secs(60).min(self.budget);
        let start = |phase, hold| {
            nccl::start(self.disc, mine, gpu, None, self.quick, phase, hold).and_then(
                |mut running| {
                    let id = running.published_id(within)?;
                    Ok((running, id))
                },
            )
        };
        let first = match start(nccl::Phase::Preset, false) {
            Ok(first) => first,
            // The others get no seat (they would wait for a root that is not there) and
            // the verdict names rank 0's failure.
            Err(e) => {
                let why = nccl::skipped("the run under the preset did not start");
                return (
                    plain,
                    seated,
                    done((json!({"seat": mine, "error": e}), why)),
                );
            }
        };
        let second = if compare {
            Some(start(nccl::Phase::Defaults, true))
        } else {
            None
        };
        let (second_id, second_run, second_fact) = match second {
            Some(Ok((running, id))) => (Some(id), Some(running), None),
            Some(Err(e)) => (None, None, Some(json!({"seat": mine, "error": e}))),
            None => (
                None,
                None,
                Some(nccl::skipped("the image sets no NCCL variable to compare")),
            ),
        };
        let (first_run, first_id) = first;
        let preset_log = self.keep_log(nccl::Phase::Preset);
        let defaults_log = self.keep_log(nccl::Phase::Defaults);
        // The rendezvous gathers the others' reports meanwhile; they report only after
        // both runs, and the second starts only once this rank's first has ended.
        let waiting = std::thread::spawn(move || {
            let first = first_run.finish(preset_log.as_deref());
            let second = match (second_run, second_fact) {
                (Some(running), _) => {
                    running.release();
                    running.finish(defaults_log.as_deref())
                }
                (None, fact) => fact.unwrap_or_default(),
            };
            (first, second)
        });
        let extra = if second_id.is_some() {
            2 * self.budget
        } else {
            self.budget
        };
        let broadcast = Broadcast {
            blob: first_id,
            seats,
            second: second_id,
            extra,
        };
        (broadcast, seated, waiting)
    }
}

/// Rank 0: runs the rendezvous and judges what it gathered, its own report among them.
fn lead(
    place: &Place,
    port: u16,
    timeout: Duration,
    mut local: Report,
    exit_code: i32,
    joining: &Joining,
) -> Report {
    let mut seated = Vec::new();
    let mut mine = None;
    let mut blob_sha256 = String::new();
    let gathered = rendezvous::lead(place, port, timeout, |others_with_gpu| {
        let (broadcast, seating, waiting) = joining.lead(others_with_gpu);
        blob_sha256 = digest(&broadcast.blob);
        seated = seating;
        mine = Some(waiting);
        broadcast
    });
    let (first, second) = match mine.map(JoinHandle::join) {
        Some(Ok(facts)) => facts,
        Some(Err(_)) => {
            let why = json!({"error": "the thread waiting for NCCL's workers panicked"});
            (why.clone(), why)
        }
        None => {
            let why = nccl::skipped("the rendezvous did not run");
            (why.clone(), why)
        }
    };
    joining.say_unkept(&first, &second);
    local.fact(nccl::FACT, first);
    local.fact(nccl::FACT_DEFAULTS, second);
    let setting = verdict::Setting {
        place,
        port,
        timeout,
        blob_sha256: &blob_sha256,
        seated: &seated,
    };
    let mut gathered = match gathered {
        Ok(gathered) => gathered,
        Err(why) => {
            let mut report = Report {
                gpubake: env!("CARGO_PKG_VERSION").to_string(),
                ..Report::default()
            };
            report.push(verdict::PHASE, "rendezvous", Status::Fail, why);
            report.fact(verdict::PHASE, serde_json::json!({ "rank_0": local }));
            return report;
        }
    };
    gathered.outcomes.insert(
        0,
        Outcome::Reported {
            peer: Peer {
                host: place.node.clone(),
                pid: std::process::id(),
                address: place.master_addr.clone(),
            },
            exit_code,
            blob_sha256: blob_sha256.clone(),
            report: serde_json::to_value(&local).unwrap_or_default(),
        },
    );
    let mut verdict = verdict::verdict(&setting, &gathered);
    super::actions::advise(&mut verdict);
    verdict
}

/// A report standing in for a local probe that could not run, so the world still hears why.
fn could_not_probe(error: &Error) -> Report {
    let mut report = Report {
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        ..Report::default()
    };
    report.push("probe", "local probe", Status::Fail, error.to_string());
    super::actions::advise(&mut report);
    report
}

/// Test-only: `GPUBAKE_WORLD_TEST_DIE_BEFORE_REPORT=1` kills a rank once the blob arrived,
/// `GPUBAKE_WORLD_TEST_REPORT_DELAY_S=N` delays its report, so the tests can make a rank
/// dead or slow at a known step instead of racing a kill against the protocol.
///
/// Read only by debug builds (what `cargo test` runs) and by builds with the
/// `world-test-hooks` feature (a release binary for `benches/h200-world.sh`'s dead rank):
/// a shipped binary must not die or stall because a variable leaked into a job's
/// environment.
#[cfg(any(debug_assertions, feature = "world-test-hooks"))]
fn rehearsal(env: &HashMap<String, String>) -> Rehearsal {
    Rehearsal {
        die_before_report: env
            .get("GPUBAKE_WORLD_TEST_DIE_BEFORE_REPORT")
            .is_some_and(|v| v == "1"),
        report_delay: env
            .get("GPUBAKE_WORLD_TEST_REPORT_DELAY_S")
            .and_then(|v| v.parse().ok())
            .map(Duration::from_secs_f64),
    }
}

/// A release build without `world-test-hooks` ignores the test variables.
#[cfg(not(any(debug_assertions, feature = "world-test-hooks")))]
fn rehearsal(_env: &HashMap<String, String>) -> Rehearsal {
    Rehearsal::default()
}

/// sha256 of `bytes`, hex.
fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Bytes that differ from run to run, so a rank cannot pass with a blob from another run.
fn blob() -> Vec<u8> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{}-{nanos}", std::process::id());
    (0u32..)
        .flat_map(|i| Sha256::digest(format!("{seed}-{i}")).to_vec())
        .take(BLOB_BYTES)
        .collect()
}

/// This node's name as the kernel has it (the container's, in its own UTS namespace).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_string())
}
