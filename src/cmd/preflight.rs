//! `gpubake preflight`: the host checked before any container starts: can its engines give
//! containers their GPUs?

use crate::error::Result;
use std::path::PathBuf;

/// `gpubake preflight`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also write the report as JUnit XML here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Also write what fleets read: prometheus:FILE (node_exporter's textfile collector) or
    /// nfd:FILE (Node Feature Discovery's features.d); repeatable.
    #[arg(long, value_name = "KIND:FILE")]
    emit: Vec<crate::probe::emit::Emit>,
    /// The host's root: `/`, or where it is mounted when gpubake runs in a container (`-v
    /// /:/host:ro` and --root /host: Docker's bind mounts are recursive, so /host/proc is the
    /// host's, where the running daemons are found).
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,
}

/// Runs the preflight, prints its report and exits with its verdict.
pub fn run(args: Args) -> Result<i32> {
    let report = crate::probe::toolkit::preflight(&args.root);
    if args.json {
        super::print_json(&report);
    } else {
        print!("{}", report.to_text());
        println!("{}", report.verdict_line());
    }
    // The verdict is printed before the files are written, and a file not written never
    // hides a failed verdict, as for the probe.
    Ok(super::probe::write_files(
        &report,
        args.junit.as_deref(),
        &args.emit,
        None,
    ))
}
