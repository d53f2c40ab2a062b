//! A recipe into the lock `resolve` writes and `render` installs from: the PyTorch stack's
//! pins, the `system:` packages pinned against the base's own archive, and, when asked, each
//! platform's Python closure written beside the lock. The build runs the same stages inside
//! its own pipeline ([`super::pipeline`]).

use crate::error::Result;
use crate::image::{Image, Transport};
use crate::lock::SystemPackage;
use crate::recipe::LoadedRecipe;
use crate::resolve::{self, Resolved};
use std::path::{Path, PathBuf};

/// What to lock and against what.
pub struct LockRequest<'a> {
    /// The recipe.
    pub recipe: &'a LoadedRecipe,
    /// Its file, where its keyring paths start; the working directory when None.
    pub recipe_file: Option<&'a Path>,
    /// The driver floor and preset directories to resolve with.
    pub options: resolve::Options,
    /// The base to pin the `system:` packages against (`--from`), instead of the recipe's
    /// own `base` pulled from its registry.
    pub from: Option<&'a str>,
    /// Check what the NCCL settings need from the OS (libibverbs for the IB transport)
    /// against the base where it is read (for the `system:` pins, or because `from` names
    /// it); where it is not, warn that it was not.
    pub check_needs: bool,
    /// Resolve each platform's closure and write it where this says.
    pub closures: Option<ClosureFiles<'a>>,
}

/// Where the closures go: `pylock` (a lock of one platform), else `dir` under the names
/// [`crate::closure::file_name_for`] gives.
pub struct ClosureFiles<'a> {
    /// The one closure's file (`--pylock`).
    pub pylock: Option<&'a Path>,
    /// The directory of the closures otherwise.
    pub dir: PathBuf,
}

/// Resolves the recipe, pins its `system:` packages and writes its closures, as `req` asks;
/// warnings go to standard error as they are found, as the build's do.
pub fn lock(req: &LockRequest) -> Result<Resolved> {
    let loaded = req.recipe;
    let mut resolved = resolve::resolve_recipe(loaded, &req.options)?;
    for w in &resolved.lock.warnings {
        eprintln!("warning: {w}");
    }
    let env = resolved.lock.image_env();
    if !loaded.recipe.system.is_empty() || (req.check_needs && req.from.is_some()) {
        let base = open_base(loaded, req.from)?;
        let pins = system_pins(loaded, req.recipe_file, &base)?;
        resolved.lock.set_system(&loaded.recipe.system, pins);
        if req.check_needs
            && let Some(w) = super::system::unmet_need(&base, &env, &resolved.lock.system)?
        {
            eprintln!("warning: {w}");
        }
    } else if let Some(need) = crate::nccl::needs::of(&env).filter(|_| req.check_needs) {
        eprintln!("warning: {}", need.warning_unread_base());
    }
    if let Some(files) = &req.closures {
        crate::closure::resolve_platforms(
            &mut resolved.lock,
            loaded.recipe.index.as_deref(),
            files.pylock,
            &files.dir,
        )
        .map_err(|e| crate::closure::at_pip_entry(e, loaded))?;
    }
    Ok(resolved)
}

/// The base a lock is pinned against: `from` (an image reference, as --from takes it), else
/// the recipe's own base pulled from its registry.
fn open_base(loaded: &LoadedRecipe, from: Option<&str>) -> Result<Image> {
    match from {
        Some(f) => f.parse::<Transport>()?.open(),
        None => Transport::of_base(&loaded.recipe.base)?
            .open()
            .map_err(super::request::with_local_copy_hint),
    }
}

/// The recipe's `system:` packages pinned against `base`.
fn system_pins(
    loaded: &LoadedRecipe,
    recipe_file: Option<&Path>,
    base: &Image,
) -> Result<Vec<SystemPackage>> {
    if loaded.recipe.system.is_empty() {
        return Ok(Vec::new());
    }
    let dir = recipe_file.and_then(Path::parent).unwrap_or(Path::new("."));
    super::system::resolve(base, loaded, dir)
}
