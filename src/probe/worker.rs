//! `gpubake probe-worker`: the GPU measurements, run as a child of `gpubake probe` so a hang
//! can be killed and NCCL starts from a fresh environment. Prints one JSON document.

use super::cuda::{self, Algo, Ranks};
use super::schedule::{self, Dtype};
use super::world::collectives;
use serde::Serialize;
use serde_json::{Value, json};

/// What the worker measures.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum Task {
    /// Peer access, device memory bandwidth, P2P bandwidth and the time of a small P2P copy.
    Cuda {
        /// Bytes per copy.
        #[arg(long, default_value_t = 1 << 30)]
        bytes: usize,
    },
    /// The bundled all-reduce: correctness on every size, time, and NCCL beside it.
    Allreduce {
        /// Ranks on each GPU (several ranks on one GPU exercise the same code path).
        #[arg(long, default_value_t = 1)]
        ranks_per_gpu: usize,
        /// Message sizes in bytes.
        #[arg(long, value_delimiter = ',', required = true)]
        sizes: Vec<u64>,
        /// Timed launches per size.
        #[arg(long, default_value_t = 20)]
        iters: u32,
        /// Also time NCCL on the same buffers.
        #[arg(long)]
        nccl: bool,
        /// Check results only, no timing.
        #[arg(long)]
        check_only: bool,
    },
    /// NCCL alone on the GPUs, with whatever NCCL_* environment the worker was given.
    Nccl {
        /// Message sizes in bytes.
        #[arg(long, value_delimiter = ',', required = true)]
        sizes: Vec<u64>,
        /// Timed launches per size.
        #[arg(long, default_value_t = 20)]
        iters: u32,
    },
    /// Level 3's load: bf16 GEMMs on the one GPU given, for a set time, results checked.
    Burn {
        /// Seconds of GEMMs.
        #[arg(long)]
        seconds: f64,
    },
    /// NCCL across the ranks of `probe --world`, on the one GPU given by --pci-bus-ids.
    World {
        /// This rank's seat in the communicator.
        #[arg(long)]
        rank: u32,
        /// Seats in the communicator.
        #[arg(long)]
        nranks: u32,
        /// NCCL's unique id from the communicator's first rank, hex.
        #[arg(
            long,
            conflicts_with = "publish_id",
            required_unless_present = "publish_id"
        )]
        id: Option<String>,
        /// Make the unique id here and write it, hex, to this file before joining.
        #[arg(long, value_name = "FILE")]
        publish_id: Option<std::path::PathBuf>,
        /// Message sizes in bytes.
        #[arg(long, value_delimiter = ',', required = true)]
        sizes: Vec<u64>,
        /// Timed launches per size.
        #[arg(long, default_value_t = 5)]
        iters: u32,
        /// Seconds from start until the communicator is aborted.
        #[arg(long)]
        deadline_s: f64,
        /// Join only once this file exists (after the id is made), or fail at the deadline.
        #[arg(long, value_name = "FILE")]
        hold: Option<std::path::PathBuf>,
    },
}

/// Runs a task on the GPUs at `pci_bus_ids` (all when empty) and returns its JSON, or an
/// error message. The JSON's `devices` says which CUDA ordinal each GPU got; every other
/// entry names GPUs by that ordinal.
pub fn run(task: &Task, pci_bus_ids: &[String]) -> Result<Value, String> {
    if let Task::World { .. } = task {
        return world(task, pci_bus_ids);
    }
    let cuda_ids = cuda::pci_bus_ids()?;
    let ordinals = if pci_bus_ids.is_empty() {
        (0..cuda_ids.len()).collect()
    } else {
        cuda::ordinals_for(pci_bus_ids, &cuda_ids).map_err(|e| {
            match std::env::var("CUDA_VISIBLE_DEVICES") {
                Ok(v) => format!("{e}; CUDA_VISIBLE_DEVICES={v} hides the others"),
                Err(_) => e,
            }
        })?
    };
    let mut devices = cuda::open(&ordinals)?;
    if devices.is_empty() {
        return Err("no CUDA device".into());
    }
    let mapping: Vec<Value> = devices
        .iter()
        .map(|d| json!({"cuda_ordinal": d.ordinal, "pci_bus_id": cuda_ids.get(d.ordinal)}))
        .collect();
    let mut out = run_on(task, &mut devices)?;
    out["devices"] = json!(mapping);
    Ok(out)
}

fn run_on(task: &Task, devices: &mut [cuda::Device]) -> Result<Value, String> {
    match task {
        Task::Cuda { bytes } => {
            let peer = cuda::peer_access(devices)?;
            // A GPU or pair that fails to measure is recorded with its error and the rest
            // are still measured: the report says which one, and why.
            let mut memory = Vec::new();
            for d in devices.iter() {
                memory.push(match cuda::memory_bandwidth(d, *bytes, 10) {
                    Ok(gbps) => json!({"gpu": d.ordinal, "gbps": gbps}),
                    Err(e) => json!({"gpu": d.ordinal, "error": e}),
                });
            }
            let mut pairs = Vec::new();
            for (i, a) in devices.iter().enumerate() {
                for (j, b) in devices.iter().enumerate() {
                    if i != j && peer[i][j] {
                        pairs.push(match cuda::p2p(a, b, (*bytes).min(256 << 20), 10) {
                            Ok((uni, both, small)) => json!({"from": a.ordinal, "to": b.ordinal, "gbps": uni, "bidir_gbps": both, "small_copy_us": small}),
                            Err(e) => json!({"from": a.ordinal, "to": b.ordinal, "error": e}),
                        });
                    }
                }
            }
            Ok(json!({"peer_access": peer, "memory": memory, "p2p": pairs}))
        }
        Task::Allreduce {
            ranks_per_gpu,
            sizes,
            iters,
            nccl,
            check_only,
        } => {
            peer_all(devices)?;
            let nvrtc = cuda::load_kernels(devices)?;
            let capacity = *sizes.iter().max().unwrap_or(&4) as usize;
            let devices: &[cuda::Device] = devices;
            let mut ranks = Ranks::new(devices, *ranks_per_gpu, capacity)?;
            let copy = if *check_only {
                None
            } else {
                Some(cuda::memory_bandwidth(
                    &devices[0],
                    capacity.max(1 << 20),
                    10,
                )?)
            };
            let mut rows = Vec::new();
            for (k, &bytes) in sizes.iter().enumerate() {
                for dtype in [Dtype::F32, Dtype::Bf16] {
                    let n = (bytes / dtype.size() as u64).max(1);
                    for algo in [Algo::OneShot, Algo::TwoShot] {
                        let seed = (k as u32) * 4 + (dtype as u32) * 2 + algo as u32 + 1;
                        ranks.fill(dtype, n, seed)?;
                        ranks.launch(dtype, algo, n)?;
                        let (checked, wrong, first) = ranks.verify(dtype, n, seed)?;
                        let mut row = Row {
                            dtype,
                            algo,
                            bytes: n * dtype.size() as u64,
                            ranks: ranks.count(),
                            checked,
                            wrong,
                            first_wrong: first,
                            ..Row::default()
                        };
                        if !*check_only {
                            let t = ranks.time(dtype, algo, n, *iters)?;
                            row.time_us = Some(t * 1e6);
                            row.busbw = Some(schedule::busbw(row.bytes, t, row.ranks));
                            if *ranks_per_gpu == 1 && devices.len() == 1 {
                                row.local_gbps = None;
                            } else if devices.len() == 1 && algo == Algo::TwoShot {
                                row.local_gbps = Some(
                                    schedule::two_shot_local_bytes(row.bytes, row.ranks) as f64
                                        / t
                                        / 1e9,
                                );
                            }
                            if *nccl && *ranks_per_gpu == 1 && algo == Algo::TwoShot {
                                match ranks.nccl_time(dtype, n, *iters) {
                                    Ok(t) => {
                                        row.nccl_time_us = Some(t * 1e6);
                                        row.nccl_busbw =
                                            Some(schedule::busbw(row.bytes, t, row.ranks));
                                    }
                                    Err(e) => row.nccl_error = Some(e),
                                }
                            }
                        }
                        rows.push(row);
                    }
                }
            }
            Ok(json!({"nvrtc": nvrtc, "copy_gbps": copy, "rows": rows}))
        }
        Task::Nccl { sizes, iters } => {
            let capacity = *sizes.iter().max().unwrap_or(&4) as usize;
            let ranks = Ranks::new(devices, 1, capacity)?;
            let mut rows = Vec::new();
            for &bytes in sizes {
                let n = (bytes / 4).max(1);
                let t = ranks.nccl_time(Dtype::F32, n, *iters)?;
                rows.push(json!({"bytes": n * 4, "time_us": t * 1e6, "busbw": schedule::busbw(n * 4, t, ranks.count())}));
            }
            Ok(json!({"rows": rows}))
        }
        Task::Burn { seconds } => {
            serde_json::to_value(super::gemm::run(devices, *seconds)?).map_err(|e| e.to_string())
        }
        Task::World { .. } => Err("the world task opens its one GPU itself".into()),
    }
}

/// NCCL across ranks: one GPU, no peer access to set up, the communicator's id given or made
/// (made first: the other ranks wait for it).
fn world(task: &Task, pci_bus_ids: &[String]) -> Result<Value, String> {
    let started = std::time::Instant::now();
    let Task::World {
        rank,
        nranks,
        id,
        publish_id,
        sizes,
        iters,
        deadline_s,
        hold,
    } = task
    else {
        unreachable!("called for the world task only");
    };
    let [address] = pci_bus_ids else {
        return Err(format!(
            "NCCL across ranks runs on one GPU per rank; {} given",
            pci_bus_ids.len()
        ));
    };
    let id: [u8; collectives::ID_BYTES] = match (id, publish_id) {
        (Some(hex_id), _) => hex::decode(hex_id)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| format!("--id is not {} bytes of hex", collectives::ID_BYTES))?,
        (None, Some(file)) => {
            let id = collectives::unique_id()?;
            crate::fsutil::write_atomic(file, hex::encode(id).as_bytes())
                .map_err(|e| format!("cannot write the unique id: {e}"))?;
            id
        }
        (None, None) => return Err("neither --id nor --publish-id".into()),
    };
    let deadline = started + std::time::Duration::from_secs_f64(*deadline_s);
    if let Some(go) = hold {
        while !go.exists() {
            if std::time::Instant::now() >= deadline {
                return Err("held until the deadline: the run before this one did not end".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    let cuda_ids = cuda::pci_bus_ids()?;
    let ordinal = cuda::ordinals_for(std::slice::from_ref(address), &cuda_ids)?[0];
    let plan = collectives::Plan {
        rank: *rank,
        nranks: *nranks,
        ordinal,
        sizes: sizes.clone(),
        iters: *iters,
        deadline,
    };
    let measured = collectives::run(&plan, &id)?;
    let mut out = serde_json::to_value(measured).map_err(|e| e.to_string())?;
    out["devices"] = json!([{"cuda_ordinal": ordinal, "pci_bus_id": cuda_ids.get(ordinal)}]);
    Ok(out)
}

fn peer_all(devices: &[cuda::Device]) -> Result<(), String> {
    let peer = cuda::peer_access(devices)?;
    for (i, row) in peer.iter().enumerate() {
        for (j, ok) in row.iter().enumerate() {
            if !ok {
                return Err(format!(
                    "GPU {i} cannot access GPU {j}: the all-reduce needs peer access between all GPUs"
                ));
            }
        }
    }
    Ok(())
}

/// One all-reduce measurement.
#[derive(Debug, Default, Serialize)]
pub struct Row {
    /// Element type.
    pub dtype: Dtype,
    /// Algorithm.
    pub algo: Algo,
    /// Message bytes.
    pub bytes: u64,
    /// Ranks.
    pub ranks: usize,
    /// Elements compared (all ranks).
    pub checked: u64,
    /// Elements that differ from the reference.
    pub wrong: u64,
    /// The first difference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_wrong: Option<String>,
    /// Microseconds per all-reduce.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<f64>,
    /// nccl-tests bus bandwidth, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busbw: Option<f64>,
    /// Device memory traffic, GB/s, when every rank shares one GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_gbps: Option<f64>,
    /// NCCL's microseconds on the same buffers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_time_us: Option<f64>,
    /// NCCL's bus bandwidth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_busbw: Option<f64>,
    /// Why NCCL did not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_error: Option<String>,
}
