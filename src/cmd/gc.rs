//! `gpubake gc`: what a layout or gpubake's cache holds that nothing needs, removed.

use crate::bake::gc::{Target, collect};
use crate::error::Result;

/// `gpubake gc`'s arguments.
#[derive(clap::Args, Debug)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["layout", "cache"])))]
pub struct Args {
    /// The layout to collect (oci:DIR, or DIR).
    #[arg(value_name = "oci:DIR")]
    layout: Option<String>,
    /// Collect gpubake's cache ($GPUBAKE_CACHE_DIR, else ~/.cache/gpubake) instead.
    #[arg(long)]
    cache: bool,
    /// List what would be removed, and remove nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

/// Collects, then says what went (or would go) and how much.
pub fn run(args: Args) -> Result<i32> {
    // clap lets exactly one of the two through.
    let target = match &args.layout {
        Some(layout) => Target::Layout(layout.strip_prefix("oci:").unwrap_or(layout).into()),
        None => Target::Cache(crate::fsutil::cache_root()?),
    };
    let found = collect(&target, args.dry_run)?;
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    if args.json {
        let items: Vec<_> = found
            .items()
            .iter()
            .map(
                |(kind, path, size)| serde_json::json!({"kind": kind, "path": path, "bytes": size}),
            )
            .collect();
        super::print_json(&serde_json::json!({
            "dry_run": args.dry_run,
            "removed": items,
            "bytes": found.bytes(),
        }));
        return Ok(0);
    }
    for (kind, path, size) in found.items() {
        println!(
            "{verb} {kind} {} ({})",
            path.display(),
            crate::units::human_size(size)
        );
    }
    println!(
        "{verb} {} files, {}",
        found.items().len(),
        crate::units::human_size(found.bytes())
    );
    Ok(0)
}
