//! `gpubake install`: a Python closure into a filesystem, as `build` installs it into layers.

use crate::bake::stack::{InstallRequest, install};
use crate::error::Result;
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
    let start = std::time::Instant::now();
    let installed = install(&InstallRequest {
        pylock: &args.pylock,
        wheels: args.wheels,
        root: &args.root,
        python_root: args.python_root.as_deref().unwrap_or(&args.root),
        offline: args.offline,
    })?;
    println!(
        "installed {} wheels ({} files) into {} over {} in {:.1} s",
        installed.wheels,
        installed.files,
        installed.venv.display(),
        installed.python,
        start.elapsed().as_secs_f64()
    );
    Ok(0)
}
