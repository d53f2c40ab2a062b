//! `gpubake probe`: a GPU node checked from inside the image, or every node of a world.

use crate::error::{Error, Result};
use std::path::PathBuf;

/// `gpubake probe`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also write the report as JUnit XML here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Shorter time budgets, fewer sizes, no NCCL runs (bandwidths are still judged).
    #[arg(long)]
    quick: bool,
    /// Also print the all-reduce table: the bundled kernel beside NCCL and a plain copy.
    #[arg(long, conflicts_with = "world")]
    bench: bool,
    /// Only these GPU indices, comma-separated.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    devices: Option<Vec<u32>>,
    /// All-reduce message sizes: MIN:MAX in bytes (powers of 16 in between), or a comma list.
    #[arg(long, value_name = "MIN:MAX")]
    sizes: Option<String>,
    /// Expected floors per GPU model (YAML like data/policy.yaml) instead of the built-in ones.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Probe every rank of a multi-node run; rank 0 gives the verdict for all.
    #[arg(long)]
    world: bool,
    /// The port rank 0 listens on for the other ranks (default: MASTER_PORT + 1, or 29501).
    #[arg(long, value_name = "PORT", requires = "world")]
    world_port: Option<u16>,
    /// Seconds each step may take: reaching rank 0, every rank's hello, every report.
    /// Allow for the slowest node's local probe; at most a day.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 300,
        requires = "world",
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    world_timeout: u64,
    /// Also keep NCCL's INFO log of the runs across ranks in this directory, one file per
    /// rank and run (`nccl-rank3.HOST.PID.log`, `nccl-defaults-rank3...` for the run
    /// under NCCL's defaults), as NCCL wrote it.
    #[arg(long, value_name = "DIR", requires = "world")]
    world_nccl_log: Option<PathBuf>,
    /// The interpreter whose PyTorch the framework phase runs on the GPUs, with its
    /// environment (a venv's bin/python3); default: the image's /opt/gpubake/venv.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
}

/// Probes this node (or, with --world, every rank's), prints the report and exits with its
/// verdict.
pub fn run(args: Args) -> Result<i32> {
    let opts = crate::probe::ProbeOptions {
        devices: args.devices,
        quick: args.quick,
        sizes: args.sizes.map(|s| parse_sizes(&s)).transpose()?,
        policy: args
            .policy
            .map(|path| crate::probe::policy::read(&path))
            .transpose()?,
        python: args.python,
        no_framework: args.world,
    };
    let report = if args.world {
        crate::probe::world::run(
            &opts,
            &crate::probe::world::WorldOptions {
                port: args.world_port,
                timeout: std::time::Duration::from_secs(args.world_timeout),
                nccl_log: args.world_nccl_log,
            },
        )?
    } else {
        crate::probe::run(&opts)?
    };
    if let Some(path) = args.junit {
        crate::fsutil::write_atomic(&path, report.to_junit().as_bytes())?;
    }
    if args.json {
        super::print_json(&report);
    } else {
        print!("{}", report.to_text());
    }
    if args.bench && !args.json {
        match report.bench_table() {
            Some(table) => print!("{table}"),
            None => eprintln!(
                "gpubake: no all-reduce measurements to show (no GPU, or the all-reduce did not run)"
            ),
        }
    }
    Ok(report.exit_code())
}

/// The largest all-reduce size `probe --sizes` takes. Each GPU holds buffers of the largest
/// size, so anything near this could never run; the bound keeps the arithmetic far from
/// overflow too.
const MAX_PROBE_SIZE: u64 = 1 << 40;

/// `MIN:MAX` (with K, M, G suffixes) as sizes growing 16x, or a comma list.
fn parse_sizes(text: &str) -> Result<Vec<u64>> {
    if let Some((lo, hi)) = text.split_once(':') {
        let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
        if lo > hi {
            return Err(Error::Usage(format!(
                "--sizes {text}: the first size is larger than the second"
            )));
        }
        // The step past the last size may not fit in a u64: the ladder ends there.
        let mut out: Vec<u64> = std::iter::successors(Some(lo), |s| s.checked_mul(16))
            .take_while(|s| *s <= hi)
            .collect();
        if out.last() != Some(&hi) {
            out.push(hi);
        }
        Ok(out)
    } else {
        text.split(',').map(parse_size).collect()
    }
}

/// One size of `--sizes`: digits with an optional K, M or G suffix.
fn parse_size(t: &str) -> Result<u64> {
    let t = t.trim();
    let (digits, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let too_large = || {
        Error::Usage(format!(
            "--sizes: `{t}` is too large; a size is at most 1024G (1 TiB), more memory than any \
             GPU has for the probe's buffers"
        ))
    };
    let n = match digits.parse::<u64>() {
        Ok(n) if n > 0 => n,
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => return Err(too_large()),
        _ => {
            return Err(Error::Usage(format!(
                "`{t}` is not a size such as 4, 64K or 1G"
            )));
        }
    };
    n.checked_mul(mult)
        .filter(|bytes| *bytes <= MAX_PROBE_SIZE)
        .ok_or_else(too_large)
}
