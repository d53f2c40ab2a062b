//! What to build: the recipe, the base, the destination, the platforms, and what to write
//! beside the image (the lock, the SBOM, the signed provenance). `gpubake build` fills one
//! from its flags; [`super::pipeline::run`] builds it.

use crate::error::{Error, Result};
use crate::image::registry::{Access, Remote};
use crate::image::{Compression, Platform, Transport};
use crate::recipe::LoadedRecipe;
use crate::version::Version;
use std::path::PathBuf;

pub use crate::sbom::Format as SbomFormat;

/// One build, as `gpubake build` asks for it.
pub struct Request {
    /// The recipe, loaded.
    pub recipe: LoadedRecipe,
    /// The file it was read from (none for the built-in default): its closure and `system:`
    /// files are found beside it.
    pub recipe_file: Option<PathBuf>,
    /// Where to write the image, as a transport's text (`oci:DIR:TAG`, `docker://…`).
    pub to: String,
    /// The base as a transport's text; none for the recipe's own, pulled from its registry.
    pub from: Option<String>,
    /// How to reach registries.
    pub access: Access,
    /// Build only this one of the lock's platforms.
    pub platform: Option<Platform>,
    /// The registry reference the `from` base is a copy of, which the image names.
    pub base_name: Option<String>,
    /// Layer compression.
    pub compression: Compression,
    /// A record of the job's start-up (`probe --record-startup`) to order eStargz layers by.
    pub startup_record: Option<PathBuf>,
    /// Write every layer again rather than trust the layer cache.
    pub no_cache: bool,
    /// Hard-link blobs between a layout destination and the layer cache (`--link-blobs`).
    pub link_blobs: bool,
    /// Registry layer caches to take layers from (`--cache-from`, `docker://…`), in order.
    pub cache_from: Vec<String>,
    /// The registry layer cache to record this build's layers in (`--cache-to`).
    pub cache_to: Option<String>,
    /// The closure (PEP 751) to install instead of pylock.NAME.toml beside the recipe.
    pub pylock: Option<PathBuf>,
    /// Build from the pylock and the wheel cache alone.
    pub offline: bool,
    /// A lock to take the `system:` packages' pins from.
    pub lock: Option<PathBuf>,
    /// Where to write the lock the image holds, with its closure beside it.
    pub lock_out: Option<PathBuf>,
    /// Leave the Python stack out: a node preflight image.
    pub without_python: bool,
    /// The most layers the Python stack may take.
    pub stack_layers: usize,
    /// Build even when the recipe's lint finds errors.
    pub skip_checks: bool,
    /// Have the Docker engine build the rendered Dockerfile instead of building daemonless.
    pub engine_build: Option<EngineBuild>,
    /// The fleet's oldest driver, over the recipe's `driver`.
    pub driver: Option<Version>,
    /// Where presets are looked up before the built-in ones.
    pub preset_dirs: Vec<PathBuf>,
    /// Where to write the image's SBOM, and in which format.
    pub sbom: Option<(PathBuf, SbomFormat)>,
    /// The gpubake binary that is the probe of each platform `probe` does not serve.
    pub probe_binaries: Vec<(Platform, PathBuf)>,
    /// The gpubake binary the image gets as its probe (the running one, for the CLI).
    pub probe: PathBuf,
    /// The key that signs the provenance (and a docker:// image), with its passphrase file.
    pub key: Option<(PathBuf, Option<PathBuf>)>,
    /// Where to write the signed provenance.
    pub provenance: Option<PathBuf>,
    /// The `resolve` command that writes this build's closure where it is read, which a
    /// stale or missing closure's error names.
    pub resolve_command: Option<String>,
    /// When the build began, for the report's times: a command's whole run, as its user sees
    /// it.
    pub began: std::time::Instant,
}

/// The engine-build variant of the bake: the rendered Dockerfile, built by the engine.
#[derive(Debug, Default)]
pub struct EngineBuild {
    /// A template to render instead of the built-in Dockerfile.template.
    pub template: Option<PathBuf>,
}

impl Request {
    /// The destination, reached as `access` says. A registry destination is asked for push
    /// access before anything is built: one that is down, or refuses the login, fails the
    /// build in seconds rather than after it.
    pub(super) fn destination(&self) -> Result<Transport> {
        let to = self.transport(&self.to)?.destination()?;
        if let Transport::Registry(remote) = &to {
            crate::image::registry::check_push_access(remote)?;
        }
        // Only a layout destination holds blob files beside the cache's; elsewhere the
        // option would be silently without effect.
        let layout = matches!(to, Transport::Oci { .. }) && self.engine_build.is_none();
        if self.link_blobs && !layout {
            return Err(Error::Usage(format!(
                "--link-blobs hard-links blobs between an oci: layout and the layer cache, and                  {} is not a layout gpubake writes: drop the option, or build to oci:DIR",
                self.to
            )));
        }
        Ok(to)
    }

    /// The registry layer caches the build reads and writes (`--cache-from`, `--cache-to`),
    /// each a `docker://` reference. A cache that could never serve this build is refused
    /// before any work: one to read while every layer is written again (`--no-cache`), or
    /// any for an engine that builds or receives the image (it keeps its own layers).
    pub(super) fn layer_caches(&self) -> Result<(Vec<Remote>, Option<Remote>)> {
        let remote = |flag: &str, text: &String| match self.transport(text)? {
            Transport::Registry(remote) => Ok(remote),
            _ => Err(Error::Usage(format!(
                "{flag} {text}: a layer cache lives in a registry; write \
                 docker://REGISTRY/REPOSITORY[:TAG]"
            ))),
        };
        let from = self
            .cache_from
            .iter()
            .map(|t| remote("--cache-from", t))
            .collect::<Result<Vec<_>>>()?;
        let to = self
            .cache_to
            .as_ref()
            .map(|t| remote("--cache-to", t))
            .transpose()?;
        if from.is_empty() && to.is_none() {
            return Ok((from, to));
        }
        let flag = if from.is_empty() {
            "--cache-to"
        } else {
            "--cache-from"
        };
        if self.no_cache && !from.is_empty() {
            return Err(Error::Usage(
                "--cache-from takes layers from a registry's cache, and --no-cache writes every \
                 layer again: give one of them"
                    .into(),
            ));
        }
        if self.engine_build.is_some() || self.to.starts_with("docker-daemon:") {
            return Err(Error::Usage(format!(
                "{flag}: the Docker Engine keeps its own layers (uncompressed, by diff ID), \
                 which a registry cache cannot hold; build to oci:DIR or docker:// for it"
            )));
        }
        Ok((from, to))
    }

    /// `text` as a transport, reaching registries as `access` says.
    pub(super) fn transport(&self, text: &str) -> Result<Transport> {
        Ok(text.parse::<Transport>()?.with_access(&self.access))
    }

    /// The base the build reads: `from`, or without it the recipe's base pulled from its
    /// registry (the engine build leaves that to the engine).
    pub(super) fn base(&self) -> Result<Option<Transport>> {
        Ok(match &self.from {
            Some(f) => Some(self.transport(f)?),
            None if self.engine_build.is_none() => Some(self.recipes_base()?),
            None => None,
        })
    }

    /// The recipe's own base, from its registry.
    pub(super) fn recipes_base(&self) -> Result<Transport> {
        Ok(Transport::of_base(&self.recipe.recipe.base)?.with_access(&self.access))
    }

    /// An error reading the base. Reading the recipe's own base (no `from`) is where a build
    /// machine that cannot reach its registry fails: those errors say how to build from a
    /// local copy instead.
    pub(super) fn base_error(&self, e: Error) -> Error {
        if self.from.is_some() {
            e
        } else {
            with_local_copy_hint(e)
        }
    }

    /// `key` signs what is pushed to a registry or written to `provenance`; for a layout, an
    /// archive or the engine without that file it would sign nothing, so it is refused before
    /// the build rather than accepted and dropped.
    pub(super) fn signs_something(&self, to: &Transport) -> Result<()> {
        if self.key.is_none() || self.provenance.is_some() || matches!(to, Transport::Registry(_)) {
            return Ok(());
        }
        Err(Error::Usage(format!(
            "--key signs the image in its registry (docker://) and the provenance written with \
             --provenance FILE; {} is not a registry: add --provenance FILE",
            self.to
        )))
    }

    /// A stale or missing closure's hint, which names `resolve` in general, with the command
    /// that writes this build's closure.
    pub(super) fn with_resolve_command(&self, e: Error) -> Error {
        const GENERAL: [&str; 2] = [
            "run `gpubake resolve RECIPE -o LOCK` again",
            "write it with `gpubake resolve RECIPE -o LOCK` where",
        ];
        match (e, &self.resolve_command) {
            (Error::Closure(mut m), Some(c)) => {
                for hint in GENERAL {
                    m = m.replace(hint, &hint.replace("gpubake resolve RECIPE -o LOCK", c));
                }
                Error::Closure(m)
            }
            (e, _) => e,
        }
    }
}

/// An error reading the recipe's own base, with the way around it: most bases are on
/// registries a build machine may not reach.
pub fn with_local_copy_hint(e: Error) -> Error {
    let hint = |m: &String| {
        format!(
            "{m}\nthe recipe's base is pulled from its registry without --from; pass \
             --from with a local copy (oci:DIR[:TAG], docker-archive:FILE) or another registry \
             (docker://REGISTRY/NAME:TAG)"
        )
    };
    match &e {
        Error::Environment(m) => Error::Environment(hint(m)),
        Error::Usage(m) => Error::Usage(hint(m)),
        _ => e,
    }
}

/// `--probe-binary PLATFORM=PATH`.
pub fn parse_probe_binary(text: &str) -> std::result::Result<(Platform, PathBuf), String> {
    let (platform, path) = text
        .split_once('=')
        .filter(|(_, p)| !p.is_empty())
        .ok_or_else(|| format!("`{text}`: expected PLATFORM=PATH, as in linux/arm64=./gpubake"))?;
    let platform: Platform = platform.parse().map_err(|e: Error| e.to_string())?;
    platform.buildable()?;
    Ok((platform, PathBuf::from(path)))
}

/// `--base-name`: an image reference as docker names images (`debian:bookworm`,
/// `registry.example:5000/team/base:1`), which the label and annotation hold as written; a
/// transport (`docker://…`, `oci:…`) or text that is no reference is refused.
pub fn parse_base_name(text: &str) -> std::result::Result<String, String> {
    let is_reference = !text.contains("://")
        && matches!(
            Transport::of_base(text),
            Ok(Transport::Registry(remote)) if remote.parsed().is_ok()
        );
    if is_reference {
        Ok(text.to_string())
    } else {
        Err(format!(
            "`{text}` is not an image reference: write REGISTRY/NAME:TAG as docker names \
             images (docker.io/library/debian:bookworm)"
        ))
    }
}

/// `--stack-layers`: a count the stack's plan can honour.
pub fn parse_stack_layers(text: &str) -> std::result::Result<usize, String> {
    let n: usize = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of layers"))?;
    let min = super::stack::MIN_STACK_LAYERS;
    if n < min {
        return Err(format!(
            "the stack takes at least {min} layers (the venv, the small nvidia wheels, the rest \
             of the closure, the recipe's extras)"
        ));
    }
    Ok(n)
}

/// The `resolve` that writes this build's closure where the build reads it (beside the
/// recipe), with the flags of the build that resolution reads too: a closure hint that left
/// out `--from` sent a recipe with `system:` to its registry's base, which fails elsewhere.
pub fn resolve_command(
    recipe: Option<&std::path::Path>,
    from: Option<&str>,
    preset_dirs: &[PathBuf],
    driver: Option<&Version>,
) -> Option<String> {
    let recipe = recipe?;
    let mut command = format!(
        "gpubake resolve {} -o {}",
        recipe.display(),
        recipe.with_extension("lock").display()
    );
    if let Some(from) = from {
        command.push_str(&format!(" --from {from}"));
    }
    for dir in preset_dirs {
        command.push_str(&format!(" --preset-dir {}", dir.display()));
    }
    if let Some(driver) = driver {
        command.push_str(&format!(" --driver {driver}"));
    }
    Some(command)
}
