//! `gpubake probe-worker` (hidden): the probe's GPU measurements, in a child process.

use crate::error::Result;
use std::path::PathBuf;

/// `gpubake probe-worker`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GPUs by PCI address (`00000000:1B:00.0`, as NVML gives them), since CUDA
    /// ordinals need not follow NVML's indices; all GPUs when absent.
    #[arg(long, value_delimiter = ',')]
    pci_bus_ids: Vec<String>,
    /// Write the JSON result here rather than to standard output, which NCCL logs to.
    #[arg(long, value_name = "FILE")]
    result: Option<PathBuf>,
    #[command(subcommand)]
    task: crate::probe::worker::Task,
}

/// Runs the task and writes its result, or its error, as JSON; exits 1 on an error.
pub fn run(args: Args) -> Result<i32> {
    let (out, code) = match crate::probe::worker::run(&args.task, &args.pci_bus_ids) {
        Ok(v) => (serde_json::json!({ "ok": v }), 0),
        Err(e) => (serde_json::json!({ "error": e }), 1),
    };
    match args.result {
        Some(path) => crate::fsutil::write_atomic(&path, out.to_string().as_bytes())?,
        None => println!("{out}"),
    }
    Ok(code)
}
