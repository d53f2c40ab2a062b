//! `gpubake build`: an image without a daemon (or, with --engine-build, with the engine).

use super::{RecipeFiles, RegistryArgs};
use crate::bake::BuildReport;
use crate::closure::Closure;
use crate::error::{Error, Result};
use crate::image::{Platform, Transport};
use crate::recipe::LoadedRecipe;
use crate::resolve::{self, Options, Resolved};
use crate::version::Version;
use std::path::{Path, PathBuf};

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
    #[arg(long, value_name = "REFERENCE", requires = "from", value_parser = parse_base_name)]
    base_name: Option<String>,
    /// Layer compression.
    #[arg(long, value_enum, default_value = "gzip")]
    compression: crate::image::Compression,
    /// Write every layer again: the layer cache knows files by path, size and mtime.
    #[arg(long)]
    no_cache: bool,
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
    #[arg(long, value_name = "N", default_value_t = 60, value_parser = parse_stack_layers)]
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
    /// verification, and for each layer written its install, compression, hashing and
    /// writing, then the transfer to the destination (`--json` always reports them).
    #[arg(long)]
    timings: bool,
    /// Also write the image's SBOM here (atomically), after the image: the base by its
    /// digest with the packages its dpkg lists, every wheel and system: .deb with its
    /// sha256 and URL, the lock's pins. For
    /// a docker:// image it is also attached there as a referrer. Not with
    /// --engine-build, whose engine keeps no manifest of the image's own.
    #[arg(long, value_name = "FILE", conflicts_with = "engine_build")]
    sbom: Option<PathBuf>,
    /// The gpubake binary that serves as the probe in the image for PLATFORM, when that
    /// is not the platform this gpubake runs on (repeatable; an ELF executable for that
    /// platform's machine).
    #[arg(long, value_name = "PLATFORM=PATH", value_parser = parse_probe_binary)]
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
    sbom_format: crate::sbom::Format,
}

/// Reads the base, resolves and lints the recipe, builds the image and writes what was asked
/// for beside it (the lock, the SBOM).
pub fn run(mut args: Args) -> Result<i32> {
    let began = std::time::Instant::now();
    let loaded = args.files.load(args.recipe.as_deref())?;
    if loaded.recipe.is_probe_image() {
        return probe_image(args, &loaded, began);
    }
    // An SBOM or lock path that could never be written is refused before the build,
    // not after.
    for path in args
        .sbom
        .iter()
        .chain(&args.lock_out)
        .chain(&args.provenance)
    {
        crate::fsutil::output_target(path)?;
    }
    let started = crate::units::rfc3339_now();
    let key = crate::sign::signing_key(args.key.as_deref(), args.passphrase_file.as_deref())?;
    let to = args.registry.transport(&args.to)?.destination()?;
    check_destination(&to)?;
    signs_something(&args, &to)?;
    let explicit = args.from.is_some();
    let from = base(&args, &loaded)?;
    let recipe_base = |e| base_error(explicit, e);
    // It is read first: a base that cannot serve the image fails the build before anything
    // is resolved over the network or written. The glibc is said only where there are wheels
    // to check, and where the base is another than the recipe's.
    let base_glibc = match &from {
        Some(base) if !args.engine_build => {
            let note = explicit && !args.without_python;
            crate::bake::fs::glibc_of_base(base, &loaded.recipe.base, note).map_err(recipe_base)?
        }
        _ => None,
    };
    // Cloned, not taken: a hint to resolve again names them (see `resolve_command`).
    let options = Options {
        driver: args.driver.clone(),
        preset_dirs: args.preset_dir.clone(),
        base_glibc,
    };
    let mut resolved = resolve::resolve_recipe(&loaded, &options)?;
    for w in &resolved.lock.warnings {
        eprintln!("warning: {w}");
    }
    if !args.skip_checks {
        crate::lint::gate(&loaded, &options)?;
    }
    let pins = system_packages(&args, &loaded, from.as_ref(), &resolved)?;
    resolved.lock.set_system(&loaded.recipe.system, pins);
    if args.engine_build {
        return engine_build(&args, &loaded, resolved.lock, &to, from.as_ref());
    }
    let only = args.registry.platform()?;
    if let Some(base) = &from {
        let plan = crate::bake::Plan::Lock(&resolved.lock);
        crate::bake::build::check_base(base, plan, only.as_ref(), !args.without_python)
            .map_err(recipe_base)?;
    }
    let cache_dir = crate::wheel::cache::WheelCache::default_root()?;
    let closures = closures(&args, &loaded, &resolved.lock, only.as_ref(), &cache_dir)?;
    // A build of one platform passes its closure as the build's closure.
    let all: Vec<&Closure> = closures.iter().map(|(_, c)| c).collect();
    crate::closure::settle(&mut resolved.lock, &all)?;
    if let Some(base) = &from {
        resolved.lock.built_on(base, args.base_name.as_deref());
    }
    let closure = match closures.as_slice() {
        [(_, one)] => Some(one.clone()),
        _ => None,
    };
    let opts = build_options(&args, (to, from), cache_dir, closure)?;
    let platforms = crate::bake::PlatformOptions {
        only,
        probes: std::mem::take(&mut args.probe_binary),
        closures: if closures.len() > 1 {
            closures.clone()
        } else {
            Vec::new()
        },
    };
    let resolve_s = began.elapsed().as_secs_f64();
    let mut report = crate::bake::build_for(&loaded, &resolved, &opts, &platforms)?;
    report.timings.resolve_s = resolve_s;
    report.timings.total_s = began.elapsed().as_secs_f64();
    if let Some(path) = &args.lock_out {
        crate::closure::write_lock(&resolved.lock, &closures, path)?;
    }
    // The SBOM and the provenance list every wheel of every platform's closure, once.
    let wheels = crate::sbom::wheels_once(closures.iter().flat_map(|(_, c)| &c.wheels));
    if let Some(path) = &args.sbom {
        write_sbom(path, args.sbom_format, (&resolved, &wheels), &opts, &report)?;
    }
    if let Some(key) = &key {
        let signed = (key, args.provenance.as_deref(), started);
        write_provenance(signed, (&resolved, &wheels), &opts, &report)?;
        sign_image(key, &opts.to, &report)?;
    }
    print_report(&report, args.json, args.timings);
    Ok(0)
}

/// The `resolve` that writes this build's closure where the build reads it (beside the
/// recipe), with the flags of the build that resolution reads too: a closure hint that left
/// out `--from` sent a recipe with `system:` to its registry's base, which fails elsewhere.
fn resolve_command(args: &Args) -> Option<String> {
    let recipe = args.recipe.as_deref()?;
    let mut command = format!(
        "gpubake resolve {} -o {}",
        recipe.display(),
        recipe.with_extension("lock").display()
    );
    if let Some(from) = &args.from {
        command.push_str(&format!(" --from {from}"));
    }
    for dir in &args.preset_dir {
        command.push_str(&format!(" --preset-dir {}", dir.display()));
    }
    if let Some(driver) = &args.driver {
        command.push_str(&format!(" --driver {driver}"));
    }
    Some(command)
}

/// A stale or missing closure's hint, which names `resolve` in general, with the command
/// itself.
fn with_resolve_command(e: Error, command: Option<&str>) -> Error {
    const GENERAL: [&str; 2] = [
        "run `gpubake resolve RECIPE -o LOCK` again",
        "write it with `gpubake resolve RECIPE -o LOCK` where",
    ];
    match (e, command) {
        (Error::Closure(mut m), Some(c)) => {
            for hint in GENERAL {
                m = m.replace(hint, &hint.replace("gpubake resolve RECIPE -o LOCK", c));
            }
            Error::Closure(m)
        }
        (e, _) => e,
    }
}

/// A registry destination is asked for push access before anything is built: one that is
/// down, or refuses the login, fails the build in seconds rather than after it.
fn check_destination(to: &Transport) -> Result<()> {
    match to {
        Transport::Registry(remote) => crate::image::registry::check_push_access(remote),
        _ => Ok(()),
    }
}

/// An error reading the base. Reading the recipe's own base (no --from) is where a build
/// machine that cannot reach its registry fails: those errors say how to build from a local
/// copy instead.
fn base_error(explicit: bool, e: Error) -> Error {
    if explicit {
        e
    } else {
        super::with_local_copy_hint(e)
    }
}

/// The build's options from the flags, with `closure` as the one Python closure it installs.
fn build_options(
    args: &Args,
    (to, from): (Transport, Option<Transport>),
    cache_dir: PathBuf,
    closure: Option<Closure>,
) -> Result<crate::bake::BuildOptions> {
    Ok(crate::bake::BuildOptions {
        to,
        from,
        compression: args.compression,
        epoch: crate::bake::build::source_date_epoch()?.unwrap_or(0),
        created: crate::bake::build::source_date_epoch()?,
        base_name: args.base_name.clone(),
        no_cache: args.no_cache,
        closure,
        offline: args.offline,
        cache_dir,
        stack_layers: args.stack_layers,
        probe: std::env::current_exe().map_err(|e| Error::io("current executable", e))?,
        // Only the SBOM lists them: without it the base's layers are not read again.
        base_packages: args.sbom.is_some(),
    })
}

/// `build` of a probe recipe (`pytorch: none`): the probe on the base, with the recipe's
/// files and presets; nothing is resolved. The flags that read or write what a lock pins are
/// refused at the recipe's `pytorch:`.
fn probe_image(mut args: Args, loaded: &LoadedRecipe, began: std::time::Instant) -> Result<i32> {
    let lock_flags = [
        (args.pylock.is_some(), "--pylock"),
        (args.lock.is_some(), "--lock"),
        (args.lock_out.is_some(), "--lock-out"),
        (args.sbom.is_some(), "--sbom"),
        (args.key.is_some(), "--key"),
        (args.engine_build, "--engine-build"),
        (args.driver.is_some(), "--driver"),
    ];
    if let Some((_, flag)) = lock_flags.iter().find(|(given, _)| *given) {
        return Err(loaded.doc.invalid(
            &["pytorch"],
            format!(
                "{flag} reads or writes what a lock pins, and `pytorch: none` builds a probe \
                 image, which pins nothing"
            ),
            Some(format!(
                "build without {flag}, or ask for a PyTorch release in `pytorch:`"
            )),
        ));
    }
    let to = args.registry.transport(&args.to)?.destination()?;
    check_destination(&to)?;
    let explicit = args.from.is_some();
    let from = match &args.from {
        Some(f) => args.registry.transport(f)?,
        None => Transport::of_base(&loaded.recipe.base)?.with_access(&args.registry.access()?),
    };
    let options = Options {
        driver: None,
        preset_dirs: std::mem::take(&mut args.preset_dir),
        base_glibc: None,
    };
    let probe = resolve::resolve_probe(loaded, &options)?;
    if !args.skip_checks {
        crate::lint::gate(loaded, &options)?;
    }
    let only = args.registry.platform()?;
    let plan = crate::bake::Plan::Probe(&probe);
    crate::bake::build::check_base(&from, plan, only.as_ref(), false)
        .map_err(|e| base_error(explicit, e))?;
    let cache_dir = crate::wheel::cache::WheelCache::default_root()?;
    let opts = build_options(&args, (to, Some(from)), cache_dir, None)?;
    let platforms = crate::bake::PlatformOptions {
        only,
        probes: std::mem::take(&mut args.probe_binary),
        closures: Vec::new(),
    };
    let resolve_s = began.elapsed().as_secs_f64();
    let mut report = crate::bake::build_probe(loaded, &probe, &opts, &platforms)?;
    report.timings.resolve_s = resolve_s;
    report.timings.total_s = began.elapsed().as_secs_f64();
    print_report(&report, args.json, args.timings);
    Ok(0)
}

/// `--timings`: one line per phase, then one per layer written, in CPU seconds per stage
/// (the stages of a layer run at once, so its wall time is not their sum).
fn print_timings(report: &BuildReport) {
    use crate::units::human_size;
    let t = &report.timings;
    let f = &t.fetch;
    println!("timings (seconds)");
    println!("  resolve    {:>8.2}", t.resolve_s);
    println!("  base       {:>8.2}", t.base_s);
    println!(
        "  wheels     {:>8.2}  downloaded {} in {} files, verified {} cached in {} files ({:.2} s hashing)",
        f.wall_s,
        human_size(f.downloaded_bytes),
        f.downloaded_files,
        human_size(f.verified_bytes),
        f.verified_files,
        f.verify_s
    );
    println!("  layers     {:>8.2}", t.layers_s);
    println!("  transfer   {:>8.2}", t.transfer_s);
    println!("  total      {:>8.2}", t.total_s);
    let written: Vec<_> = report
        .layers
        .iter()
        .filter_map(|l| l.timing.as_ref().map(|t| (l, t)))
        .collect();
    if written.is_empty() {
        return;
    }
    println!(
        "  {:<24} {:>10} {:>10} {:>7} {:>8} {:>8} {:>6} {:>6}",
        "layer written", "tar", "blob", "wall", "install", "compress", "hash", "write"
    );
    for (l, t) in written {
        println!(
            "  {:<24} {:>10} {:>10} {:>7.2} {:>8.2} {:>8.2} {:>6.2} {:>6.2}",
            l.name,
            human_size(t.tar_bytes),
            human_size(l.size),
            t.wall_s,
            t.install_s,
            t.compress_s,
            t.hash_s,
            t.write_s
        );
    }
}

/// Each platform's closure: read from its own file or resolved into the cache (none for an
/// image without Python). An error names the recipe's `pip:` entry uv blames, and a hint to
/// resolve again is the command that does it.
fn closures(
    args: &Args,
    loaded: &LoadedRecipe,
    lock: &crate::lock::Lock,
    only: Option<&Platform>,
    cache_dir: &Path,
) -> Result<Vec<(Platform, Closure)>> {
    if args.without_python {
        return Ok(Vec::new());
    }
    let source = crate::closure::Source {
        recipe_file: args.recipe.as_deref(),
        explicit: args.pylock.as_deref(),
        index: loaded.recipe.index.as_deref(),
        offline: args.offline,
        cache_dir,
    };
    crate::closure::for_build_platforms(lock, &source, only)
        .map_err(|e| super::at_pip_entry(e, loaded))
        .map_err(|e| with_resolve_command(e, resolve_command(args).as_deref()))
}

/// The recipe's `system:` packages, resolved against the base build reads (`from`; for an
/// engine build without --from, the recipe's own from its registry: the Dockerfile installs
/// the same pins). They are pinned for one platform: a recipe for several is refused at the
/// field.
fn system_packages(
    args: &Args,
    loaded: &LoadedRecipe,
    from: Option<&Transport>,
    resolved: &crate::resolve::Resolved,
) -> Result<Vec<crate::lock::SystemPackage>> {
    let recipe = &loaded.recipe;
    if recipe.system.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(path) = &args.lock {
        return pins_of_lock(path, &recipe.system);
    }
    if args.offline {
        // Pinning reads the archive's signed indexes; a build that promised not to reach
        // the network says so rather than reach it.
        return Err(loaded.doc.invalid(
            &["system"],
            "--offline: system packages are pinned from their archive's signed index, which \
             needs the network",
            Some(
                "pass --lock with a lock `resolve -o` wrote for this recipe: its pins, and the \
                 .debs from the cache"
                    .into(),
            ),
        ));
    }
    let base = match from {
        Some(b) => b.clone(),
        None => Transport::of_base(&recipe.base)?.with_access(&args.registry.access()?),
    };
    if args.engine_build && !recipe.apt.is_empty() {
        return Err(loaded.doc.invalid(
            &["apt"],
            "--engine-build installs with the base's own apt sources; the recipe's `apt:` \
             archives are read by a daemonless build only",
            Some("build without --engine-build".into()),
        ));
    }
    let [platform] = resolved.lock.platforms.as_slice() else {
        return Err(loaded.doc.invalid(
            &["system"],
            format!(
                "system packages are pinned for one platform, and the recipe builds for {}",
                resolved.lock.platforms.join(", ")
            ),
            Some("build each platform from its own recipe".into()),
        ));
    };
    let platform: Platform = platform.parse()?;
    let image = base.open_for(&platform)?;
    let dir = args
        .recipe
        .as_deref()
        .and_then(std::path::Path::parent)
        .unwrap_or(std::path::Path::new("."));
    crate::bake::system::resolve(&image, loaded, dir)
}

/// The `system:` pins of the lock at `path`, which must have been resolved for the same
/// `asked` (the recipe's `system:`).
fn pins_of_lock(path: &Path, asked: &[String]) -> Result<Vec<crate::lock::SystemPackage>> {
    let doc = crate::document::Document::read(path)?;
    let lock: crate::lock::Lock = doc.parse("lock", |_| None)?;
    if lock.system_asked != asked {
        return Err(doc.invalid(
            &["system_asked"],
            format!(
                "the lock's pins were resolved for `system: [{}]`, and the recipe asks for \
                 `system: [{}]`",
                lock.system_asked.join(", "),
                asked.join(", ")
            ),
            Some("resolve -o again for this recipe".into()),
        ));
    }
    Ok(lock.system)
}

/// The base the build reads: --from, or without it the recipe's base pulled from its
/// registry, reached as the registry options say (the engine build leaves it to the engine).
fn base(args: &Args, loaded: &LoadedRecipe) -> Result<Option<Transport>> {
    Ok(match &args.from {
        Some(f) => Some(args.registry.transport(f)?),
        None if !args.engine_build => {
            Some(Transport::of_base(&loaded.recipe.base)?.with_access(&args.registry.access()?))
        }
        None => None,
    })
}

/// `--key` signs what is pushed to a registry or written to `--provenance FILE`; for a
/// layout, an archive or the engine without that file it would sign nothing, so it is refused
/// before the build rather than accepted and dropped.
fn signs_something(args: &Args, to: &crate::image::Transport) -> Result<()> {
    if args.key.is_none()
        || args.provenance.is_some()
        || matches!(to, crate::image::Transport::Registry(_))
    {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "--key signs the image in its registry (docker://) and the provenance written with \
         --provenance FILE; {} is not a registry: add --provenance FILE",
        args.to
    )))
}

/// The base as the build read it: `--from` as given, else the recipe's own base.
fn base_source(resolved: &Resolved, opts: &crate::bake::BuildOptions) -> String {
    opts.from
        .as_ref()
        .map_or_else(|| resolved.lock.base.clone(), ToString::to_string)
}

/// What the SBOM and the provenance describe: the built image, its base and what went in.
fn subject<'a>(
    resolved: &'a Resolved,
    wheels: &'a [crate::wheel::cache::WheelRef],
    base_source: &'a str,
    opts: &crate::bake::BuildOptions,
    report: &'a BuildReport,
) -> crate::sbom::Subject<'a> {
    crate::sbom::Subject {
        lock: &resolved.lock,
        wheels,
        base_digest: report.base.as_str(),
        base_source,
        base_packages: report.base_packages.as_ref(),
        image_digest: report.manifest.as_str(),
        epoch: opts.epoch,
        created: crate::units::parse_rfc3339(&report.created).unwrap_or(opts.epoch),
    }
}

/// `--sbom FILE`: writes the image's SBOM there and, for a docker:// image, attaches it.
fn write_sbom(
    path: &Path,
    format: crate::sbom::Format,
    (resolved, wheels): (&Resolved, &[crate::wheel::cache::WheelRef]),
    opts: &crate::bake::BuildOptions,
    report: &BuildReport,
) -> Result<()> {
    let base_source = base_source(resolved, opts);
    let subject = subject(resolved, wheels, &base_source, opts, report);
    let attached = crate::image::sbom::write(
        &subject.render(format)?,
        format.media_type(),
        path,
        &opts.to,
        &report.manifest,
        &report.created,
    )?;
    eprintln!("wrote the SBOM to {}", path.display());
    if let Some(artifact) = attached {
        eprintln!("attached the SBOM to {} as {artifact}", report.image);
    }
    Ok(())
}

/// `--key`: signs the build's provenance, writes it to `--provenance FILE` and, for a
/// docker:// image, attaches it there.
fn write_provenance(
    (key, path, started): (&crate::sign::keys::PrivateKey, Option<&Path>, String),
    (resolved, wheels): (&Resolved, &[crate::wheel::cache::WheelRef]),
    opts: &crate::bake::BuildOptions,
    report: &BuildReport,
) -> Result<()> {
    use crate::sign::bundle::{self, Bundle};
    let base_source = base_source(resolved, opts);
    let subject = subject(resolved, wheels, &base_source, opts, report);
    let run = crate::bake::provenance::Run {
        started,
        finished: crate::units::rfc3339_now(),
    };
    let statement = crate::bake::provenance::statement(&opts.to.subject_name(), &subject, &run);
    let bytes = serde_json::to_vec(&Bundle::sign(&statement, key)).expect("bundles serialize");
    if let Some(path) = path {
        crate::fsutil::write_atomic(path, &bytes)?;
        eprintln!("wrote the signed provenance to {}", path.display());
    }
    if let crate::image::Transport::Registry(remote) = &opts.to {
        let artifact = crate::image::referrers::attach(
            remote,
            &report.manifest,
            bundle::MEDIA_TYPE,
            &bytes,
            bundle::annotations(crate::bake::provenance::PREDICATE, &run.finished),
        )?;
        eprintln!(
            "attached the signed provenance to {} as {artifact}",
            report.image
        );
    }
    Ok(())
}

/// `--key` with a docker:// image: signs its manifest, and each platform's manifest of an
/// index (podman checks the one it pulls), as podman and skopeo verify at pull
/// (`sha256-<hex>.sig`).
fn sign_image(
    key: &crate::sign::keys::PrivateKey,
    to: &crate::image::Transport,
    report: &BuildReport,
) -> Result<()> {
    let crate::image::Transport::Registry(remote) = to else {
        return Ok(());
    };
    let mut manifests = vec![report.manifest.clone()];
    if report.platforms.len() > 1 {
        for p in &report.platforms {
            manifests.push(p.manifest.parse().map_err(Error::Usage)?);
        }
    }
    let name = crate::image::signature::signed_name(&remote.parsed()?);
    for manifest in &manifests {
        let payload = crate::image::signature::payload(&name, manifest);
        let signature = key.sign(&payload);
        crate::image::signature::attach(remote, manifest, &payload, &signature)?;
        eprintln!(
            "signed {manifest} as {name} ({})",
            crate::image::signature::tag(manifest)
        );
    }
    Ok(())
}

/// What was built, as JSON or text.
fn print_report(report: &BuildReport, json: bool, timings: bool) {
    if json {
        super::print_json(report);
        return;
    }
    print_layers(report);
    if timings {
        print_timings(report);
    }
}

/// The human report: the image, its manifest and its layers. The time is the command's
/// whole run, resolution and the base included, as a user timing the command sees it.
fn print_layers(report: &BuildReport) {
    println!("built {} in {:.2} s", report.image, report.timings.total_s);
    if report.platforms.len() > 1 {
        println!("  index    {}", report.manifest);
        for p in &report.platforms {
            println!("  {:<14} manifest {}", p.platform, p.manifest);
        }
        println!("  layers of {}:", report.platforms[0].platform);
    } else {
        println!("  manifest {}", report.manifest);
    }
    if report.image.starts_with("docker-daemon:") {
        // The engine keeps no manifest of ours: it stores the image under its config digest,
        // and `inspect docker-daemon:` rebuilds a manifest from `docker save`, whose digest
        // differs. Name the one the engine shows.
        println!(
            "  image ID {} in the engine (what `docker images` shows; the engine does not \
             keep the manifest above, and `inspect docker-daemon:` reports one rebuilt from \
             `docker save`)",
            report.config
        );
    }
    for l in &report.layers {
        println!(
            "  {:<8} {} {:>9} {}",
            l.name,
            l.digest,
            crate::units::human_size(l.size),
            if l.reused { "reused" } else { "written" }
        );
    }
}

/// `build --engine-build`: renders the Dockerfile and has the Docker engine build it.
fn engine_build(
    args: &Args,
    loaded: &LoadedRecipe,
    mut lock: crate::lock::Lock,
    to: &Transport,
    from: Option<&Transport>,
) -> Result<i32> {
    // The engine builds for the machine it runs on, from the linux/amd64 closure the
    // Dockerfile installs: a recipe that names other platforms is built by gpubake itself.
    if lock.platforms != crate::lock::default_platforms() {
        return Err(Error::Unsupported(format!(
            "--engine-build builds linux/amd64 only, and the recipe builds for {}; build \
             without --engine-build (to oci:, docker:// or, with --platform, docker-daemon:)",
            lock.platforms.join(", ")
        )));
    }
    let Transport::DockerDaemon(tag) = to else {
        return Err(Error::Usage(
            "--engine-build writes to the engine: use --to docker-daemon:NAME:TAG".into(),
        ));
    };
    match from {
        None => {}
        Some(Transport::DockerDaemon(base)) => {
            lock.rebase(base.clone());
            if let Some(name) = &args.base_name {
                lock.labels
                    .insert(crate::lock::BASE_NAME.to_string(), name.clone());
            }
        }
        Some(other) => {
            return Err(Error::Usage(format!(
                "--engine-build reads its base from the engine: use --from docker-daemon:NAME:TAG, not {other}"
            )));
        }
    }
    let (plan, dockerfile) = crate::bake::render::ContextPlan::with_dockerfile(
        loaded,
        &lock,
        !args.without_python,
        args.template.as_deref(),
    )?;
    let engine = crate::engine::Engine::connect()?;
    let entries = plan.entries_for_build(
        loaded,
        &lock,
        &dockerfile,
        args.recipe.as_deref(),
        args.pylock.as_deref(),
        args.offline,
    )?;
    // The context is streamed to the engine from a file: it holds every wheel.
    let scratch = crate::interrupt::scratch_dir(None, ".gpubake-context-")
        .map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let tar_path = scratch.path().join("context.tar");
    let file = std::fs::File::create(&tar_path).map_err(|e| Error::io(&tar_path, e))?;
    let file =
        crate::image::layer::write_tar(&entries, 0, std::io::BufWriter::new(file), &tar_path)?;
    file.into_inner()
        .map_err(|e| Error::io(&tar_path, e.into_error()))?
        .sync_all()
        .map_err(|e| Error::io(&tar_path, e))?;
    let start = std::time::Instant::now();
    engine.build(&tar_path, tag, |line| eprintln!("{line}"))?;
    println!(
        "built docker-daemon:{tag} with the engine at {} in {:.1} s",
        engine.host(),
        start.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// `--probe-binary PLATFORM=PATH`.
fn parse_probe_binary(text: &str) -> std::result::Result<(Platform, PathBuf), String> {
    let (platform, path) = text
        .split_once('=')
        .filter(|(_, p)| !p.is_empty())
        .ok_or_else(|| format!("`{text}`: expected PLATFORM=PATH, as in linux/arm64=./gpubake"))?;
    let platform: Platform = platform.parse().map_err(|e: Error| e.to_string())?;
    platform.buildable()?;
    Ok((platform, PathBuf::from(path)))
}

/// `--stack-layers`: a count the stack's plan can honour.
/// `--base-name`: an image reference as docker names images (`debian:bookworm`,
/// `registry.example:5000/team/base:1`), which the label and annotation hold as written; a
/// transport (`docker://…`, `oci:…`) or text that is no reference is refused.
fn parse_base_name(text: &str) -> std::result::Result<String, String> {
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

fn parse_stack_layers(text: &str) -> std::result::Result<usize, String> {
    let n: usize = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of layers"))?;
    let min = crate::bake::stack::MIN_STACK_LAYERS;
    if n < min {
        return Err(format!(
            "the stack takes at least {min} layers (the venv, the small nvidia wheels, the rest \
             of the closure, the recipe's extras)"
        ));
    }
    Ok(n)
}
