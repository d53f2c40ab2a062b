//! `gpubake probe`: a GPU node checked from inside the image, or every node of a world.

use crate::error::{Error, Result};
use crate::probe::ProbeOptions;
use crate::probe::budget::Level;
use crate::probe::report::{Report, Status};
use std::path::PathBuf;
use std::time::Duration;

/// `gpubake probe`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also write the report as JUnit XML here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// How deep to look: 1 passive (<= 10 s), 2 active (<= 120 s), 3 burn (level 2, then
    /// --burn-seconds of GEMMs on every GPU, <= 180 s more than the burn).
    #[arg(long, value_name = "1|2|3", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=3))]
    level: u8,
    /// Seconds of GEMMs level 3 runs on every GPU.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    burn_seconds: u64,
    /// A budget for the whole run in place of the level's own (seconds).
    #[arg(long, value_name = "SECS", hide = true, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    budget: Option<u64>,
    /// Also write what fleets read: prometheus:FILE (node_exporter's textfile collector) or
    /// nfd:FILE (Node Feature Discovery's features.d); repeatable.
    #[arg(long, value_name = "KIND:FILE")]
    emit: Vec<crate::probe::emit::Emit>,
    /// Shorter steps, fewer sizes, no NCCL runs (bandwidths are still judged), at any level.
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
    /// Record which files under site-packages the framework phase's start-up reads (import
    /// torch; on a GPU also CUDA init, a GEMM, a cuDNN convolution, an NCCL all-reduce), in
    /// the order it first reads them, into FILE: the record `build --compression estargz
    /// --startup-record` (or zstd:chunked) lays the layers out by. Keep it beside the lock.
    #[arg(long, value_name = "FILE", conflicts_with = "world")]
    record_startup: Option<PathBuf>,
}

/// Probes this node (or, with --world, every rank's), prints the report and exits with its
/// verdict.
pub fn run(args: Args) -> Result<i32> {
    // The probe runs anyway (its verdict and exit code matter more than the files), but a
    // file that cannot be written is said before a burn of minutes, not only after it.
    let outputs = (args
        .junit
        .iter()
        .map(|p| (format!("--junit {}", p.display()), p.as_path())))
    .chain(args.emit.iter().map(|e| (e.to_string(), e.path())));
    for (flag, path) in outputs {
        if let Some(dir) = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.is_dir())
        {
            eprintln!(
                "warning: {flag}: the directory {} does not exist, so the file will not be \
                 written (the probe runs and reports all the same)",
                dir.display()
            );
        }
    }
    if args.record_startup.is_some() && args.level < 2 {
        return Err(Error::Usage(
            "--record-startup needs --level 2 or 3: level 1 does not run the framework phase"
                .into(),
        ));
    }
    let opts = crate::probe::ProbeOptions {
        devices: args.devices,
        quick: args.quick,
        sizes: args.sizes.map(|s| parse_sizes(&s)).transpose()?,
        policy: args
            .policy
            .map(|path| crate::probe::policy::read(&path))
            .transpose()?,
        python: args.python,
        record_startup: args.record_startup.is_some(),
        no_framework: args.world,
        level: Level::from_number(args.level).expect("clap keeps the level in 1..=3"),
        burn: Duration::from_secs(args.burn_seconds),
        budget: args.budget.map(Duration::from_secs),
    };
    let mut report = if args.world {
        crate::probe::world::run(
            &opts,
            &crate::probe::world::WorldOptions {
                port: args.world_port,
                timeout: Duration::from_secs(args.world_timeout),
                nccl_log: args.world_nccl_log,
            },
        )?
    } else {
        within_budget(opts)?
    };
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
    if !args.json {
        println!("{}", report.verdict_line());
    }
    // The verdict is printed before the files are written, so a file that cannot be
    // written (a missing directory) never hides it.
    // Each error names the flag that asked for the file.
    let record = args
        .record_startup
        .map(|path| crate::probe::write_startup_record(&path, report.startup.take()))
        .map(|written| written.map(|said| eprintln!("gpubake: {said}")));
    Ok(write_files(
        &report,
        args.junit.as_deref(),
        &args.emit,
        record,
    ))
}

/// Writes the report's JUnit file and `--emit` files after `earlier` writes, says each one
/// that failed (naming the flag that asked for it), and returns the exit code: the
/// verdict's, as [`exit_code`] settles it with the files. `gpubake preflight` ends the same
/// way.
pub(super) fn write_files(
    report: &Report,
    junit: Option<&std::path::Path>,
    emit: &[crate::probe::emit::Emit],
    earlier: impl IntoIterator<Item = std::result::Result<(), String>>,
) -> i32 {
    let junit = junit.map(|path| {
        crate::fsutil::write_atomic(path, report.to_junit().as_bytes())
            .map_err(|e| format!("--junit {}: {e}", path.display()))
    });
    let emits = emit
        .iter()
        .map(|emit| crate::probe::emit::write(report, emit).map_err(|e| format!("{emit}: {e}")));
    let mut unwritten = false;
    for written in earlier.into_iter().chain(junit).chain(emits) {
        if let Err(e) = written {
            eprintln!("error: {e}");
            unwritten = true;
        }
    }
    exit_code(report.exit_code(), unwritten)
}

/// The probe's exit code once its files are written. A file that could not be written never
/// lowers a failed verdict (a prolog must still drain the node), and it is exit 2, never the
/// 3 of a full disk: a scheduler reads 3 as "no GPU here", which some let pass.
fn exit_code(verdict: i32, unwritten: bool) -> i32 {
    match (verdict, unwritten) {
        (1, _) | (_, false) => verdict,
        (_, true) => crate::error::BAD_INPUT,
    }
}

/// How long past its budget a level's run may take to stop its last step and report.
const GRACE: Duration = Duration::from_secs(5);

/// Runs the probe on a thread of its own and waits for it no longer than its level's budget
/// and a grace: a step that does not stop on time (a driver call that never returns) still
/// leaves a verdict, a failure naming the step.
fn within_budget(opts: ProbeOptions) -> Result<Report> {
    let budget = opts.total_budget();
    let level = opts.level;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(crate::probe::run(&opts));
    });
    match rx.recv_timeout(budget + GRACE) {
        Ok(report) => report,
        Err(_) => {
            let mut report = Report {
                gpubake: env!("CARGO_PKG_VERSION").to_string(),
                level: level.number(),
                seconds: (budget + GRACE).as_secs_f64(),
                ..Report::default()
            };
            report.push(
                "budget",
                format!("level {}", level.number()),
                Status::Fail,
                format!(
                    "no verdict within the level's {} s budget: stopped in step `{}`, which did \
                     not return (a hung driver call?)",
                    budget.as_secs(),
                    crate::probe::budget::current_step()
                ),
            );
            crate::probe::actions::advise(&mut report);
            Ok(report)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::exit_code;

    #[test]
    fn a_file_left_unwritten_never_lowers_a_failure_nor_reads_as_no_gpu() {
        // Every verdict, with and without a file that could not be written.
        for verdict in [0, 1, 2, 3] {
            assert_eq!(exit_code(verdict, false), verdict);
        }
        assert_eq!(exit_code(0, true), 2);
        assert_eq!(exit_code(1, true), 1);
        assert_eq!(exit_code(2, true), 2);
        assert_eq!(exit_code(3, true), 2);
    }
}
