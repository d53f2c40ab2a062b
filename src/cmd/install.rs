//! `gpubake install`: a Python closure into a filesystem, as `build` installs it into layers.

use crate::error::{Error, Result};
use std::path::PathBuf;

/// `gpubake install`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The closure (PEP 751), as `gpubake resolve -o` writes it.
    pylock: PathBuf,
    /// The wheel cache to take wheels from (and fill, unless --offline).
    #[arg(long, value_name = "DIR")]
    wheels: PathBuf,
    /// The filesystem root to install under.
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,
    /// The filesystem whose CPython the venv runs on, the image's root (default: --root).
    #[arg(long, value_name = "DIR")]
    python_root: Option<PathBuf>,
    /// Take every wheel from --wheels; download none.
    #[arg(long)]
    offline: bool,
}

/// Installs the closure over the root's CPython and says where.
pub fn run(args: Args) -> Result<i32> {
    let text = crate::closure::read_text(&args.pylock)?;
    let closure = crate::closure::parse(&args.pylock, &text)?;
    let want = closure.inputs().map(|i| i.python).ok_or_else(|| {
        Error::Closure(format!(
            "{}: no [tool.gpubake] table names the CPython it was resolved for",
            args.pylock.display()
        ))
    })?;
    let root = &args.root;
    let python_root = args.python_root.as_deref().unwrap_or(root);
    let python = crate::bake::stack::find_python_in(python_root, &want).map_err(|m| {
        Error::Environment(format!(
            "{}: {m}; the venv runs on the CPython of --root, or of --python-root when the \
             stack is installed apart from the image's filesystem",
            python_root.display()
        ))
    })?;
    let cache = crate::wheel::cache::WheelCache::open(args.wheels)?;
    let fetch = crate::wheel::cache::FetchOptions {
        offline: args.offline,
        ..Default::default()
    };
    let epoch = crate::bake::build::source_date_epoch()?.unwrap_or(0);
    let start = std::time::Instant::now();
    let files = crate::bake::stack::install_into(root, &closure, &python, &cache, &fetch, epoch)?;
    println!(
        "installed {} wheels ({files} files) into {} over {} in {:.1} s",
        closure.wheels.len(),
        root.join(crate::names::VENV.trim_start_matches('/'))
            .display(),
        python.path,
        start.elapsed().as_secs_f64()
    );
    Ok(0)
}
