//! `gpubake lint`: the NCCL settings of recipes, presets and nccl.conf files.

use crate::error::Result;
use crate::lint::{self, LintOptions};
use crate::resolve::Options;
use crate::version::Version;
use std::path::PathBuf;

/// `gpubake lint`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Files to check: recipes and presets (.yaml) or NCCL config files (anything else).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Treat warnings as failures.
    #[arg(long)]
    strict: bool,
    /// Check against this NCCL version instead of the one each file implies.
    #[arg(long, value_name = "VERSION")]
    nccl: Option<Version>,
    /// Print findings as JSON.
    #[arg(long)]
    json: bool,
    /// Look up presets here before the built-in ones (repeatable).
    #[arg(long, value_name = "DIR")]
    preset_dir: Vec<PathBuf>,
}

/// Lints every file and prints the findings with their totals.
pub fn run(args: Args) -> Result<i32> {
    let opts = LintOptions {
        nccl: args.nccl,
        resolve: Options {
            preset_dirs: args.preset_dir,
            ..Options::default()
        },
    };
    let reports: Vec<_> = args
        .files
        .iter()
        .map(|f| lint::lint_file(f, &opts))
        .collect();
    let totals = lint::totals(&reports);
    if args.json {
        super::print_json(&serde_json::json!({ "files": reports, "totals": totals }));
    } else {
        for finding in reports.iter().flat_map(|r| &r.findings) {
            println!("{finding}");
        }
        println!(
            "{} file{} checked: {} error{}, {} warning{}",
            totals.files,
            plural(totals.files),
            totals.errors,
            plural(totals.errors),
            totals.warnings,
            plural(totals.warnings)
        );
    }
    // A file that could not be read is bad input, not a finding.
    Ok(if reports.iter().any(|r| r.unreadable) {
        crate::error::BAD_INPUT
    } else {
        totals.verdict(args.strict).exit_code()
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
