//! `gpubake resolve`: a recipe into a lock, and the lock's closures with it.

use super::{RecipeFiles, emit};
use crate::bake::locking::{self, ClosureFiles, LockRequest};
use crate::error::Result;
use crate::resolve::Resolved;
use crate::version::Version;
use std::path::{Path, PathBuf};

/// `gpubake resolve`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The recipe (YAML).
    recipe: Option<PathBuf>,
    #[command(flatten)]
    files: RecipeFiles,
    /// Write the lock here (atomically) instead of to standard output, and the closure
    /// beside it.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Write the closure (PEP 751) here instead of pylock.NAME.toml beside the lock.
    #[arg(long, value_name = "FILE")]
    pylock: Option<PathBuf>,
    /// Do not resolve the Python closure (no uv, no index needed).
    #[arg(long, conflicts_with = "pylock")]
    no_closure: bool,
    /// The fleet's oldest driver; overrides the recipe's `driver`.
    #[arg(long, value_name = "VERSION")]
    driver: Option<Version>,
    /// Also list every candidate build and why it was refused.
    #[arg(long)]
    explain: bool,
    /// Print the lock as JSON.
    #[arg(long)]
    json: bool,
    /// Look up presets here before the built-in ones (repeatable).
    #[arg(long, value_name = "DIR")]
    preset_dir: Vec<PathBuf>,
    /// The base the recipe's `system:` packages are pinned against (its dpkg status and
    /// apt sources), instead of the recipe's `base` pulled from its registry; what the NCCL
    /// settings need from the OS (libibverbs for the IB transport) is checked against it.
    #[arg(long, value_name = "IMAGE")]
    from: Option<String>,
}

/// Resolves the recipe, writes the closures (with -o or --pylock) and the lock.
pub fn run(args: Args) -> Result<i32> {
    let (loaded, opts) = super::recipe_options(
        &args.files,
        args.recipe.as_deref(),
        args.driver,
        args.preset_dir,
    )?;
    let closure_dir = match (&args.pylock, &args.output) {
        _ if args.no_closure => None,
        (Some(_), _) => Some(PathBuf::new()),
        (None, Some(out)) => Some(out.parent().unwrap_or(Path::new("")).to_path_buf()),
        (None, None) => None,
    };
    let request = LockRequest {
        recipe: &loaded,
        recipe_file: args.recipe.as_deref(),
        options: opts,
        from: args.from.as_deref(),
        check_needs: true,
        closures: closure_dir.map(|dir| ClosureFiles {
            pylock: args.pylock.as_deref(),
            dir,
        }),
    };
    let resolved = locking::lock(&request).inspect_err(|e| {
        // A script that asked for JSON gets JSON on failure too: the error, its exit code
        // and, for a conflict, its parts.
        if args.json {
            super::print_json(&e.to_json());
        }
    })?;
    if args.explain {
        explain(&resolved);
    }
    let text = if args.json {
        serde_json::to_string_pretty(&resolved.lock).expect("locks serialize") + "\n"
    } else {
        resolved.lock.to_yaml()
    };
    emit(args.output.as_deref(), &text)?;
    Ok(0)
}

/// `--explain`: every candidate build, and why each was refused.
fn explain(resolved: &Resolved) {
    eprintln!("candidates ({}):", resolved.considered.len());
    let v = &resolved.lock.torch.version;
    let chosen = format!(
        "torch {}.{}+{}",
        v.major(),
        v.minor(),
        resolved.lock.torch.variant
    );
    for (label, why) in &resolved.considered {
        match why.first() {
            None if *label == chosen => eprintln!("  * {label}: chosen"),
            None => eprintln!("  + {label}: admitted"),
            Some(first) => eprintln!("  - {label}: {first}"),
        }
    }
}
