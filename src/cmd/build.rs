//! `gpubake build`: an image without a daemon (or, with --engine-build, with the engine).

use super::{RecipeFiles, RegistryArgs};
use crate::bake::pipeline::Built;
use crate::bake::request::{self, EngineBuild, Request, SbomFormat};
use crate::error::{Error, Result};
use crate::image::Platform;
use crate::version::Version;
use std::path::PathBuf;

/// `gpubake build`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The recipe (YAML); the built-in default when absent.
    recipe: Option<PathBuf>,
    #[command(flatten)]
    files: RecipeFiles,
    /// Where to write the image: a layout, an archive, an engine's NAME:TAG or a registry's
    /// tag (a reference by digest names an image that exists and is refused).
    #[arg(long, value_name = "DEST")]
    to: String,
    /// The base image; when absent, the recipe's `base`, pulled from its registry
    /// (`nvidia/cuda:TAG` from Docker Hub, `HOST:PORT/NAME:TAG` from HOST:PORT).
    #[arg(long, value_name = "BASE")]
    from: Option<String>,
    /// The registry reference the --from base is a copy of (`docker.io/library/debian:
    /// bookworm`): the image names it as its base (label and annotation
    /// org.opencontainers.image.base.name). Without it, a base read from a layout, an archive
    /// or the engine is named by digest alone.
    #[arg(long, value_name = "REFERENCE", requires = "from", value_parser = request::parse_base_name)]
    base_name: Option<String>,
    /// Layer compression.
    #[arg(long, value_enum, default_value = "gzip")]
    compression: crate::image::Compression,
    /// With --compression estargz or zstd:chunked: lay each Python layer out for the job's
    /// start-up that FILE records (`gpubake probe --record-startup FILE`, kept beside the
    /// lock), so the stargz snapshotter fetches what the start-up reads before the container
    /// starts.
    #[arg(long, value_name = "FILE")]
    startup_record: Option<PathBuf>,
    /// Write every layer again rather than take it from the layer cache.
    #[arg(long)]
    no_cache: bool,
    /// Hard-link blobs between an oci: layout and gpubake's layer cache instead of cloning
    /// (reflink) or copying them: faster where the filesystem cannot clone, and takes no
    /// space, but the layout then shares its blob files with the cache and with every layout
    /// built so, and a change made to one of them in place (an editor, a script that
    /// rewrites a file) damages them all.
    #[arg(long)]
    link_blobs: bool,
    /// Take the layers the local cache lacks from this registry layer cache
    /// (docker://REGISTRY/REPO:TAG; repeatable, asked in order).
    #[arg(long, value_name = "REF")]
    cache_from: Vec<String>,
    /// Record this build's layers in this registry layer cache, for --cache-from.
    #[arg(long, value_name = "REF")]
    cache_to: Option<String>,
    /// Install this closure (PEP 751) instead of pylock.NAME.toml beside the recipe.
    #[arg(long, value_name = "FILE")]
    pylock: Option<PathBuf>,
    /// Build from the pylock and the wheel cache alone: no resolution, no download (a
    /// recipe with `system:` also needs --lock for its packages' pins).
    #[arg(long)]
    offline: bool,
    /// Take the `system:` packages' pins from this lock (what `resolve -o` or --lock-out
    /// wrote for the same recipe) instead of resolving them from the archive: an OS layer
    /// that reproduces the lock's, and what an --offline build installs.
    #[arg(long, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// Also write the lock the image holds here (atomically), with the closure it
    /// installs beside it as pylock.NAME.toml, as `resolve -o` writes them.
    #[arg(long, value_name = "FILE", conflicts_with = "engine_build")]
    lock_out: Option<PathBuf>,
    /// Leave the Python stack out: a node preflight image with the probe and presets only.
    #[arg(long, conflicts_with = "pylock")]
    without_python: bool,
    /// The most layers the Python stack may take (one per large wheel, then groups; at
    /// least 4: the venv, the small nvidia wheels, the rest, the extras).
    #[arg(long, value_name = "N", default_value_t = 60, value_parser = request::parse_stack_layers)]
    stack_layers: usize,
    /// Build even when the recipe's lint finds errors (certify will fail the image).
    #[arg(long)]
    skip_checks: bool,
    /// Build with the Docker engine from the rendered Dockerfile instead (DEST must be
    /// docker-daemon:NAME:TAG; BASE, if given, docker-daemon:NAME:TAG too).
    #[arg(long)]
    engine_build: bool,
    /// With --engine-build: render this template instead of the built-in Dockerfile.template.
    #[arg(long, value_name = "FILE", requires = "engine_build")]
    template: Option<PathBuf>,
    /// The fleet's oldest driver; overrides the recipe's `driver`.
    #[arg(long, value_name = "VERSION")]
    driver: Option<Version>,
    /// Look up presets here before the built-in ones (repeatable).
    #[arg(long, value_name = "DIR")]
    preset_dir: Vec<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Also print where the time went: resolution, the base, the wheels' download and
    /// verification, the transfer to the destination, and each layer's source (written, local
    /// or registry cache) with, for one written, its install, compression, hashing and writing
    /// (`--json` always reports them).
    #[arg(long)]
    timings: bool,
    /// Also write the image's SBOM here (atomically), after the image: the base by its digest
    /// with the packages its dpkg lists, every wheel and system: .deb with its sha256 and URL,
    /// the lock's pins. For a docker:// image it is also attached there as a referrer. Not
    /// with --engine-build, whose engine keeps no manifest of the image's own.
    #[arg(long, value_name = "FILE", conflicts_with = "engine_build")]
    sbom: Option<PathBuf>,
    /// The gpubake binary that serves as the probe in the image for PLATFORM, when that
    /// is not the platform this gpubake runs on (repeatable; an ELF executable for that
    /// platform's machine).
    #[arg(long, value_name = "PLATFORM=PATH", value_parser = request::parse_probe_binary)]
    probe_binary: Vec<(Platform, PathBuf)>,
    /// Sign the build's provenance (an in-toto statement with an SLSA provenance v1
    /// predicate: the recipe, the base and every wheel and .deb by digest) with this private
    /// key. For a docker:// image, also attach the provenance there as a Sigstore bundle and
    /// sign the image's manifest (the `sha256-<hex>.sig` signature podman, skopeo and cosign
    /// check at pull, and `verify --key` checks).
    #[arg(long, value_name = "KEY", conflicts_with = "engine_build")]
    key: Option<PathBuf>,
    /// The key's passphrase: the file's first line (default: $GPUBAKE_KEY_PASSPHRASE, else
    /// empty).
    #[arg(long, value_name = "FILE", requires = "key")]
    passphrase_file: Option<PathBuf>,
    /// Also write the signed provenance (the Sigstore bundle) here.
    #[arg(long, value_name = "FILE", requires = "key")]
    provenance: Option<PathBuf>,
    /// The SBOM's format: SPDX 2.3 JSON or CycloneDX 1.6 JSON.
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        default_value = "spdx",
        requires = "sbom"
    )]
    sbom_format: SbomFormat,
}

/// Builds what the flags ask for and prints what was built.
pub fn run(args: Args) -> Result<i32> {
    let began = std::time::Instant::now();
    let recipe = args.files.load(args.recipe.as_deref())?;
    let request = Request {
        recipe,
        resolve_command: request::resolve_command(
            args.recipe.as_deref(),
            args.from.as_deref(),
            &args.preset_dir,
            args.driver.as_ref(),
        ),
        to: args.to,
        from: args.from,
        access: args.registry.access()?,
        platform: args.registry.platform()?,
        base_name: args.base_name,
        compression: args.compression,
        startup_record: args.startup_record,
        no_cache: args.no_cache,
        link_blobs: args.link_blobs,
        cache_from: args.cache_from,
        cache_to: args.cache_to,
        pylock: args.pylock,
        offline: args.offline,
        lock: args.lock,
        lock_out: args.lock_out,
        without_python: args.without_python,
        stack_layers: args.stack_layers,
        skip_checks: args.skip_checks,
        engine_build: args.engine_build.then_some(EngineBuild {
            template: args.template,
        }),
        driver: args.driver,
        preset_dirs: args.preset_dir,
        sbom: args.sbom.map(|path| (path, args.sbom_format)),
        probe_binaries: args.probe_binary,
        probe: std::env::current_exe().map_err(|e| Error::reading("current executable", e))?,
        key: args.key.map(|key| (key, args.passphrase_file)),
        provenance: args.provenance,
        recipe_file: args.recipe,
        began,
    };
    match crate::bake::pipeline::run(&request)? {
        Built::Image(report) if args.json => super::print_json(&report),
        Built::Image(report) => print!("{}", report.human(args.timings)),
        Built::Engine(e) => println!(
            "built docker-daemon:{} with the engine at {} in {:.1} s",
            e.tag, e.host, e.seconds
        ),
    }
    Ok(0)
}
