//! NCCL across the ranks, from each rank's probe: which GPU a rank brings, the worker that
//! joins the communicator (rank 0's also makes NCCL's unique id, which the rendezvous
//! broadcasts), and what NCCL's own log says about the transport it took to each peer.
//! Rank 0's judgement of what every rank sent back is in `judge`.

use crate::probe::env::Discovery;
use crate::probe::nccl_log::NcclLog;
use crate::probe::nvml;
use crate::probe::report::Report;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The fact each rank adds to its report: its part of NCCL across ranks.
pub const FACT: &str = "world_nccl";

/// The same, run again with every variable of the preset set empty (NCCL's defaults).
pub const FACT_DEFAULTS: &str = "world_nccl_defaults";

/// Which run of the communicator: under the image's preset, or NCCL's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The image's NCCL variables as they are.
    Preset,
    /// Every variable that `compared` lists set empty, which NCCL treats as unset and which
    /// keeps /etc/nccl.conf from filling it in.
    Defaults,
}

/// The preset's variables the A/B compares: not the probe's own, not multicast (always
/// off), and not NCCL_HOSTID, which says where a rank runs rather than how NCCL tunes.
pub fn compared(variables: &[(String, String)]) -> Vec<(String, String)> {
    variables
        .iter()
        .filter(|(k, _)| {
            !crate::probe::effective::SET_BY_PROBE.contains(&k.as_str()) && k != "NCCL_HOSTID"
        })
        .cloned()
        .collect()
}

/// NCCL's subsystems in the log: INIT for the connection to each peer ("via NET/Socket/0"),
/// NET for the network chosen, GRAPH for the path type of the topology search (NVL is
/// NVLink), ENV for the variables it took.
const LOG_SUBSYS: &str = "INIT,NET,GRAPH,ENV";

/// Message sizes: small, where latency rules, to large, where bandwidth does.
pub fn sizes(quick: bool) -> Vec<u64> {
    if quick {
        vec![1 << 20, 16 << 20, 64 << 20]
    } else {
        vec![1 << 20, 16 << 20, 256 << 20]
    }
}

/// This rank's GPU for NCCL, by PCI address: under one process per GPU (torchrun, srun with
/// a task per GPU) local rank r drives the r-th GPU the local probe saw, as a training job
/// would. Err says why the rank brings none.
pub fn gpu_for(
    local: &Report,
    local_rank: u32,
    nccl_found: bool,
    cuda_visible: Option<&str>,
) -> Result<String, String> {
    if local.no_gpu {
        return Err("no GPU on this node (local exit 3)".into());
    }
    // (NVML index, UUID, PCI address) of each GPU the local probe looked at.
    let gpus: Vec<(u32, String, String)> = local.facts["nvml"]["gpus"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(|g| {
            let index = u32::try_from(g["index"].as_u64()?).ok()?;
            let uuid = g["uuid"].as_str().unwrap_or("").to_string();
            Some((index, uuid, g["pci_bus_id"].as_str()?.to_string()))
        })
        .collect();
    if gpus.is_empty() {
        return Err("the local probe found no GPU it could address".into());
    }
    if !nccl_found {
        return Err("no libnccl.so.2 in the image (neither next to torch nor the system's)".into());
    }
    // The NCCL worker opens its GPU through CUDA, so the rank's GPU is the local rank's among
    // those CUDA shows it (all of them, in PCI order, when CUDA_VISIBLE_DEVICES is unset).
    let indexed: Vec<(u32, String)> = gpus.iter().map(|g| (g.0, g.1.clone())).collect();
    let order = nvml::cuda_visible(cuda_visible, &indexed).unwrap_or_else(|| {
        let mut by_address: Vec<&(u32, String, String)> = gpus.iter().collect();
        by_address.sort_by(|a, b| a.2.cmp(&b.2));
        by_address.iter().map(|g| g.0).collect()
    });
    let Some(&index) = order.get(local_rank as usize % order.len().max(1)) else {
        return Err(format!(
            "CUDA_VISIBLE_DEVICES={:?} shows none of the GPUs probed here",
            cuda_visible.unwrap_or_default()
        ));
    };
    gpus.iter()
        .find(|g| g.0 == index)
        .map(|g| g.2.clone())
        .ok_or_else(|| format!("GPU {index} was not probed here"))
}

/// Rank 0's seating: rank 0 first (its process holds NCCL's bootstrap root), then every
/// other rank that brings a GPU, in rank order. Empty when rank 0 has no GPU or no other
/// rank has one: there is no communicator to make.
pub fn seating(rank_zero_has_gpu: bool, others_with_gpu: &[u32]) -> Vec<u32> {
    if !rank_zero_has_gpu || others_with_gpu.is_empty() {
        return Vec::new();
    }
    let mut seats = vec![0];
    seats.extend(others_with_gpu.iter().copied().filter(|r| *r != 0));
    seats.sort_unstable();
    seats.dedup();
    seats
}

/// A seat in the communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seat {
    /// This rank's rank in the communicator.
    pub seat: u32,
    /// Ranks in the communicator.
    pub seats: u32,
    /// Seconds the worker may take, from its start.
    pub budget_s: u64,
}

/// A worker joining the communicator.
pub struct Running {
    child: Child,
    dir: tempfile::TempDir,
    _shim: Option<tempfile::TempDir>,
    started: Instant,
    budget: Duration,
    seat: Seat,
    gpu: String,
    variables: Vec<(String, String)>,
}

/// Starts the worker for `seat` on `gpu`, joining the communicator `id`, or (rank 0, `id`
/// None) making the id first; `published_id` then reads it back. With `hold`, the worker
/// joins only once `release` is called (rank 0's second run waits for its first).
pub fn start(
    disc: &Discovery,
    seat: Seat,
    gpu: &str,
    id: Option<&[u8]>,
    quick: bool,
    phase: Phase,
    hold: bool,
) -> Result<Running, String> {
    let dir = crate::probe::scratch_dir()?;
    let (mut env, shim) = crate::probe::worker_env(disc, 1);
    let variables = crate::probe::image_preset(disc);
    match phase {
        Phase::Preset => env.extend(variables.iter().cloned()),
        Phase::Defaults => env.extend(
            compared(&variables)
                .into_iter()
                .map(|(k, _)| (k, String::new())),
        ),
    }
    env.extend([
        ("NCCL_DEBUG".to_string(), "INFO".to_string()),
        ("NCCL_DEBUG_SUBSYS".to_string(), LOG_SUBSYS.to_string()),
        (
            "NCCL_DEBUG_FILE".to_string(),
            dir.path().join("nccl.%h.%p.log").display().to_string(),
        ),
        // Never multicast on shared machines, whatever the image says.
        ("NCCL_NVLS_ENABLE".to_string(), "0".to_string()),
    ]);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find gpubake: {e}"))?;
    let sizes = sizes(quick)
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut command = Command::new(exe);
    command
        .args(["probe-worker", "--pci-bus-ids", gpu, "--result"])
        .arg(dir.path().join("result.json"))
        .args(["world", "--rank", &seat.seat.to_string()])
        .args(["--nranks", &seat.seats.to_string(), "--sizes", &sizes])
        .args(["--iters", if quick { "5" } else { "20" }])
        // The worker aborts NCCL a little before it is killed, so it can say why.
        .arg("--deadline-s")
        .arg(seat.budget_s.saturating_sub(3).max(1).to_string());
    match id {
        Some(id) => command.args(["--id", &hex::encode(id)]),
        None => command.arg("--publish-id").arg(dir.path().join("id")),
    };
    if hold {
        command.arg("--hold").arg(dir.path().join("go"));
    }
    let child = command
        .envs(env)
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(dir.path().join("stderr"))
                .map_err(|e| format!("cannot make the worker's error file: {e}"))?,
        )
        .spawn()
        .map_err(|e| format!("cannot start the NCCL worker: {e}"))?;
    Ok(Running {
        child,
        dir,
        _shim: shim,
        started: Instant::now(),
        budget: Duration::from_secs(seat.budget_s),
        seat,
        gpu: gpu.to_string(),
        variables,
    })
}

impl Running {
    /// Lets a worker started with `hold` join.
    pub fn release(&self) {
        if let Err(e) = std::fs::write(self.dir.path().join("go"), b"") {
            eprintln!("gpubake: cannot release the second NCCL run: {e}");
        }
    }

    /// The unique id rank 0's worker made, once it is written (or the worker ended, or the
    /// deadline passed).
    pub fn published_id(&mut self, within: Duration) -> Result<Vec<u8>, String> {
        let file = self.dir.path().join("id");
        let until = Instant::now() + within;
        loop {
            if let Ok(text) = std::fs::read_to_string(&file) {
                return hex::decode(text.trim())
                    .map_err(|e| format!("the worker wrote an id that is not hex: {e}"));
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "the NCCL worker ended ({status}) before making the unique id: {}",
                    self.failure()
                ));
            }
            if Instant::now() >= until {
                return Err(format!(
                    "no unique id from the NCCL worker within {} s",
                    within.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Why the worker failed, from its own result or its last words.
    fn failure(&self) -> String {
        let result = self.dir.path().join("result.json");
        if let Some(error) = std::fs::read(&result)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["error"].as_str().map(String::from))
        {
            return error;
        }
        let stderr = std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default();
        crate::child::last_words(&stderr)
    }

    /// Waits for the worker (killing it past its budget) and returns this rank's fact: its
    /// seat, GPU, preset, measurements or error, and what NCCL's log says. With `keep`
    /// (`DIR/nccl-rank3`), NCCL's log files are also copied there, under that prefix.
    pub fn finish(mut self, keep: Option<&std::path::Path>) -> Value {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if self.started.elapsed() > self.budget => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        let result: Option<Value> = std::fs::read(self.dir.path().join("result.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let (measured, error) = match (&status, result) {
            (None, _) => (
                Value::Null,
                format!(
                    "killed after {} s: NCCL did not return by its deadline",
                    self.budget.as_secs()
                ),
            ),
            (Some(_), Some(v)) if v.get("ok").is_some() => (v["ok"].clone(), String::new()),
            (Some(_), _) => (Value::Null, self.failure()),
        };
        let logs = log_files(self.dir.path());
        if let Some(prefix) = keep {
            keep_logs(&logs, prefix);
        }
        let log = NcclLog::parse(
            &logs
                .iter()
                .filter_map(|f| std::fs::read(f).ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .collect::<Vec<_>>()
                .join("\n"),
        );
        let mut fact = json!({
            "seat": self.seat,
            "gpu": self.gpu,
            "variables": self.variables,
            "expects_net": expects_net(&self.variables),
            "expects_nvlink": crate::probe::effective::expects_nvlink(&self.variables, &[]),
            "hostid": std::env::var("NCCL_HOSTID").ok(),
            "measured": measured,
            "log": log,
        });
        if !error.is_empty() {
            fact["error"] = json!(error);
        }
        fact
    }
}

impl Drop for Running {
    /// A worker given up on (its id never came) is not left running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The network transport the preset asks for: NCCL_NET names it (NCCL then fails at init
/// rather than fall back); None when the preset leaves the choice to NCCL.
pub fn expects_net(variables: &[(String, String)]) -> Option<String> {
    variables
        .iter()
        .rev()
        .find(|(k, v)| k == "NCCL_NET" && !v.is_empty())
        .map(|(_, v)| v.clone())
}

/// A rank's fact when it brings no GPU to NCCL, or a run did not happen.
pub fn skipped(why: &str) -> Value {
    json!({ "skipped": why })
}

/// Copies NCCL's log files to `prefix.NAME`; a failure is said, not fatal: the log is a
/// copy for people, the verdict already has what it says.
fn keep_logs(logs: &[PathBuf], prefix: &std::path::Path) {
    if let Some(dir) = prefix.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if logs.is_empty() {
        eprintln!(
            "gpubake: --world-nccl-log: no NCCL log as {}: the worker ran but NCCL wrote none \
             (it failed before its first line; the verdict has the worker's error)",
            prefix.display()
        );
    }
    for file in logs {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("nccl.log");
        let name = name.strip_prefix("nccl").unwrap_or(name);
        let target = PathBuf::from(format!("{}{name}", prefix.display()));
        if let Err(e) = std::fs::copy(file, &target) {
            eprintln!(
                "gpubake: cannot keep NCCL's log as {}: {e}",
                target.display()
            );
        }
    }
}

/// Every file in `dir` whose name starts `nccl.`, in name order.
fn log_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|f| {
        f.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("nccl."))
    });
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_zero_sits_first_and_alone_is_no_communicator() {
        assert_eq!(seating(true, &[3, 1]), vec![0, 1, 3]);
        assert!(seating(false, &[1, 2]).is_empty());
        assert!(seating(true, &[]).is_empty());
    }

    fn two_gpus() -> Report {
        let mut local = Report::default();
        local.fact(
            "nvml",
            json!({"gpus": [
                {"index": 1, "uuid": "GPU-bbbb2222-0000", "pci_bus_id": "00000000:DB:00.0"},
                {"index": 0, "uuid": "GPU-aaaa1111-0000", "pci_bus_id": "00000000:1B:00.0"},
            ]}),
        );
        local
    }

    #[test]
    fn the_local_rank_picks_a_gpu_in_pci_order() {
        let mut local = two_gpus();
        assert_eq!(gpu_for(&local, 0, true, None).unwrap(), "00000000:1B:00.0");
        assert_eq!(gpu_for(&local, 3, true, None).unwrap(), "00000000:DB:00.0");
        assert!(
            gpu_for(&local, 0, false, None)
                .unwrap_err()
                .contains("libnccl")
        );
        local.no_gpu = true;
        assert!(
            gpu_for(&local, 0, true, None)
                .unwrap_err()
                .contains("exit 3")
        );
    }

    #[test]
    fn the_gpu_is_taken_from_the_ones_cuda_visible_devices_shows() {
        let local = two_gpus();
        // One GPU bound per task: every local rank takes that one, not the GPU at its rank.
        assert_eq!(
            gpu_for(&local, 0, true, Some("1")).unwrap(),
            "00000000:DB:00.0"
        );
        assert_eq!(
            gpu_for(&local, 1, true, Some("0")).unwrap(),
            "00000000:1B:00.0"
        );
        // CUDA's order is the list's: local rank 0 gets the first entry.
        assert_eq!(
            gpu_for(&local, 0, true, Some("1,0")).unwrap(),
            "00000000:DB:00.0"
        );
        assert_eq!(
            gpu_for(&local, 1, true, Some("1,0")).unwrap(),
            "00000000:1B:00.0"
        );
        // UUIDs, whole or a prefix; reading stops at an entry CUDA could not read.
        assert_eq!(
            gpu_for(&local, 0, true, Some("GPU-bbbb")).unwrap(),
            "00000000:DB:00.0"
        );
        assert_eq!(
            gpu_for(&local, 1, true, Some("0,x,1")).unwrap(),
            "00000000:1B:00.0"
        );
        let hidden = gpu_for(&local, 0, true, Some("7")).unwrap_err();
        assert!(hidden.contains("CUDA_VISIBLE_DEVICES=\"7\""), "{hidden}");
        assert!(gpu_for(&local, 0, true, Some("")).is_err());
    }

    #[test]
    fn nccl_net_is_the_expectation() {
        let v = |k: &str, val: &str| (k.to_string(), val.to_string());
        assert_eq!(
            expects_net(&[v("NCCL_NET", "IB"), v("NCCL_IB_TIMEOUT", "22")]).as_deref(),
            Some("IB")
        );
        assert_eq!(expects_net(&[v("NCCL_NET", "")]), None);
        assert_eq!(expects_net(&[]), None);
    }
}
