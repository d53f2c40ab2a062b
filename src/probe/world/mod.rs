//! `gpubake probe --world`: the probe on every node of a multi-node run, started by the
//! launcher the cluster already uses (torchrun `--no-python`, srun, mpirun, a PyTorchJob or
//! JobSet). Each rank probes its own node, then joins a small rendezvous that rank 0 runs on
//! a port of its own (never the launcher's `MASTER_PORT`); rank 0 gathers every report and
//! gives one verdict, naming each rank that is missing, died or was too slow.
//!
//! For now the world checks that the ranks reach each other and agree; NCCL across the
//! nodes, with its unique id carried by the broadcast, comes later.

pub mod hostlist;
mod launchers;
pub mod place;
pub mod rendezvous;
pub mod verdict;
pub mod wire;

use super::report::{Report, Status};
use crate::error::Error;
use place::Place;
use rendezvous::{Contribution, Outcome, Peer, Rehearsal};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How to run the rendezvous.
#[derive(Clone, Debug)]
pub struct WorldOptions {
    /// The port rank 0 listens on, instead of `MASTER_PORT` + 1.
    pub port: Option<u16>,
    /// The deadline of each step: reaching rank 0, every hello, every report.
    pub timeout: Duration,
}

/// The bytes rank 0 broadcasts: as long as NCCL's unique id, which they will carry later.
const BLOB_BYTES: usize = 128;

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

    if place.rank == 0 {
        let mut report = lead(&place, port, world.timeout, local, exit_code);
        report.seconds = start.elapsed().as_secs_f64();
        return Ok(report);
    }
    let mine = Contribution {
        exit_code,
        report: serde_json::to_value(&local).unwrap_or_default(),
    };
    match rendezvous::follow(&place, port, world.timeout, mine, rehearsal(&env)) {
        Ok(counted) => local.push(verdict::PHASE, "rendezvous", Status::Pass, counted),
        Err(why) => local.push(verdict::PHASE, "rendezvous", Status::Fail, why),
    }
    local.seconds = start.elapsed().as_secs_f64();
    match local_error {
        Some(e) => Err(e),
        None => Ok(local),
    }
}

/// Rank 0: runs the rendezvous and judges what it gathered, its own report among them.
fn lead(place: &Place, port: u16, timeout: Duration, local: Report, exit_code: i32) -> Report {
    let blob = blob();
    let blob_sha256 = digest(&blob);
    let setting = verdict::Setting {
        place,
        port,
        timeout,
        blob_sha256: &blob_sha256,
    };
    let mut gathered = match rendezvous::lead(place, port, timeout, &blob) {
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
            },
            exit_code,
            blob_sha256: blob_sha256.clone(),
            report: serde_json::to_value(&local).unwrap_or_default(),
        },
    );
    verdict::verdict(&setting, &gathered)
}

/// A report standing in for a local probe that could not run, so the world still hears why.
fn could_not_probe(error: &Error) -> Report {
    let mut report = Report {
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        ..Report::default()
    };
    report.push("probe", "local probe", Status::Fail, error.to_string());
    report
}

/// Test-only: `GPUBAKE_WORLD_TEST_DIE_BEFORE_REPORT=1` kills a rank once the blob arrived,
/// `GPUBAKE_WORLD_TEST_REPORT_DELAY_S=N` delays its report, so the tests can make a rank
/// dead or slow at a known step instead of racing a kill against the protocol.
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
