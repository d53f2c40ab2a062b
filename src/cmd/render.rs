//! `gpubake render`: a recipe's Dockerfile, or its whole build context.

use super::{RecipeFiles, emit};
use crate::bake::locking::{self, LockRequest};
use crate::bake::render::ContextPlan;
use crate::error::Result;
use crate::version::Version;
use std::path::PathBuf;

/// `gpubake render`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The recipe (YAML); the built-in default when absent.
    recipe: Option<PathBuf>,
    #[command(flatten)]
    files: RecipeFiles,
    /// Write the Dockerfile here (atomically) instead of to standard output.
    #[arg(short, long, conflicts_with = "context")]
    output: Option<PathBuf>,
    /// Write the whole build context into this directory (created if missing).
    #[arg(long, value_name = "DIR")]
    context: Option<PathBuf>,
    /// With --context: the closure to install instead of pylock.NAME.toml beside the recipe.
    #[arg(long, value_name = "FILE", requires = "context")]
    pylock: Option<PathBuf>,
    /// With --context: take the wheels from the wheel cache alone.
    #[arg(long, requires = "context")]
    offline: bool,
    /// Leave the Python stack out (a preflight image: probe and presets).
    #[arg(long, conflicts_with_all = ["pylock", "offline"])]
    without_python: bool,
    /// Use this template instead of the built-in Dockerfile.template.
    #[arg(long, value_name = "FILE")]
    template: Option<PathBuf>,
    /// The fleet's oldest driver; overrides the recipe's `driver`.
    #[arg(long, value_name = "VERSION")]
    driver: Option<Version>,
    /// Look up presets here before the built-in ones (repeatable).
    #[arg(long, value_name = "DIR")]
    preset_dir: Vec<PathBuf>,
    /// The base the recipe's `system:` packages are pinned against (its dpkg status and apt
    /// sources), instead of the recipe's `base` pulled from its registry.
    #[arg(long, value_name = "IMAGE")]
    from: Option<String>,
}

/// Renders the Dockerfile and writes it, or the build context with it.
pub fn run(args: Args) -> Result<i32> {
    let Args {
        recipe,
        files,
        output,
        context,
        pylock,
        offline,
        without_python,
        template,
        driver,
        preset_dir,
        from,
    } = args;
    let (loaded, opts) = super::recipe_options(&files, recipe.as_deref(), driver, preset_dir)?;
    // The Dockerfile installs the same pins a daemonless build unpacks.
    let resolved = locking::lock(&LockRequest {
        recipe: &loaded,
        recipe_file: recipe.as_deref(),
        options: opts,
        from: from.as_deref(),
        check_needs: false,
        closures: None,
    })?;
    let (plan, dockerfile) = ContextPlan::with_dockerfile(
        &loaded,
        &resolved.lock,
        !without_python,
        template.as_deref(),
    )?;
    let Some(dir) = context else {
        emit(output.as_deref(), &dockerfile)?;
        return Ok(0);
    };
    let entries = plan.entries_for_build(
        &loaded,
        &resolved.lock,
        &dockerfile,
        recipe.as_deref(),
        pylock.as_deref(),
        offline,
    )?;
    crate::bake::render::write_context(entries, &dir)?;
    eprintln!(
        "wrote the build context to {}: docker build {}",
        dir.display(),
        dir.display()
    );
    Ok(0)
}
