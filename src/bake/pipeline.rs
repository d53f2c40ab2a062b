//! A [`Request`] from start to end, stage by stage: check what will be written, read the
//! base, resolve and lint the recipe, pin its `system:` packages, fix each platform's closure,
//! settle the lock, bake the image (or have the engine build it), and write what was asked
//! for beside it.

use super::outputs;
use super::request::{EngineBuild, Request};
use super::{BuildOptions, BuildReport, Plan, PlatformOptions};
use crate::closure::Closure;
use crate::error::{Error, Result};
use crate::image::{Platform, Transport};
use crate::lock::{Lock, SystemPackage};
use crate::resolve::{self, Options};
use crate::version::Version;
use std::path::{Path, PathBuf};

/// What a request built.
pub enum Built {
    /// An image gpubake wrote (boxed: its report is large beside the engine's).
    Image(Box<BuildReport>),
    /// An image the engine built from the rendered Dockerfile.
    Engine(EngineBuilt),
}

/// What the engine built.
pub struct EngineBuilt {
    /// The `NAME:TAG` it holds the image as.
    pub tag: String,
    /// The engine's address.
    pub host: String,
    /// Seconds the engine's build took.
    pub seconds: f64,
}

/// Builds what `req` asks for: the image, and the lock, the SBOM and the signed provenance
/// beside it.
pub fn run(req: &Request) -> Result<Built> {
    if req.recipe.recipe.is_probe_image() {
        return probe_image(req).map(|report| Built::Image(Box::new(report)));
    }
    let started = outputs::start(req)?;
    let startup = startup_record(req)?;
    let to = req.destination()?;
    req.signs_something(&to)?;
    req.layer_caches()?;
    let from = req.base()?;
    let base_glibc = base_glibc(req, from.as_ref())?;
    let options = Options {
        driver: req.driver.clone(),
        preset_dirs: req.preset_dirs.clone(),
        base_glibc,
    };
    let mut resolved = resolve::resolve_recipe(&req.recipe, &options)?;
    if let Some((at, record)) = &startup {
        let torch = &resolved.lock.torch;
        record.check_torch(&format!("{}+{}", torch.version, torch.variant), at)?;
    }
    for w in &resolved.lock.warnings {
        eprintln!("warning: {w}");
    }
    if !req.skip_checks {
        crate::lint::gate(&req.recipe, &options)?;
    }
    let pins = system_packages(req, from.as_ref(), &resolved.lock)?;
    resolved.lock.set_system(&req.recipe.recipe.system, pins);
    if let Some(engine) = &req.engine_build {
        return engine_build(req, engine, resolved.lock, &to, from.as_ref()).map(Built::Engine);
    }
    let only = req.platform.clone();
    if let Some(base) = &from {
        let plan = Plan::Lock(&resolved.lock);
        super::build::check_base(base, plan, only.as_ref(), !req.without_python)
            .map_err(|e| req.base_error(e))?;
    }
    let cache_dir = crate::wheel::cache::WheelCache::default_root()?;
    let closures = closures(req, &resolved.lock, only.as_ref(), &cache_dir)?;
    settle(&mut resolved.lock, &closures, from.as_ref(), req)?;
    let closure = match closures.as_slice() {
        [(_, one)] => Some(one.clone()),
        _ => None,
    };
    let mut opts = build_options(req, (to, from), cache_dir, closure)?;
    opts.startup = startup;
    let platforms = PlatformOptions {
        only,
        probes: req.probe_binaries.clone(),
        closures: if closures.len() > 1 {
            closures.clone()
        } else {
            Vec::new()
        },
    };
    let resolve_s = req.began.elapsed().as_secs_f64();
    let mut report = super::build_for(&req.recipe, &resolved, &opts, &platforms)?;
    report.timings.resolve_s = resolve_s;
    report.timings.total_s = req.began.elapsed().as_secs_f64();
    outputs::write(req, started, (&resolved, &closures), &opts, &report)?;
    Ok(Built::Image(Box::new(report)))
}

/// The start-up record the request orders its layers by, read and checked before anything
/// is resolved: it orders eStargz or zstd:chunked layers of a Python stack that gpubake
/// writes, and nothing else.
fn startup_record(req: &Request) -> Result<Option<(PathBuf, crate::startup::StartupRecord)>> {
    let Some(at) = &req.startup_record else {
        return Ok(None);
    };
    let refused = if req.compression.toc().is_none() {
        Some("orders lazily pulled layers: add --compression estargz or zstd:chunked")
    } else if req.without_python {
        Some("orders the Python stack's layers, and --without-python builds none")
    } else if req.engine_build.is_some() {
        Some("orders layers gpubake writes, and --engine-build has the engine write them")
    } else {
        None
    };
    if let Some(why) = refused {
        return Err(Error::Usage(format!("--startup-record {why}")));
    }
    let record = crate::startup::StartupRecord::read(at)?;
    Ok(Some((at.clone(), record)))
}

/// The base's glibc, read first: a base that cannot serve the image fails the build before
/// anything is resolved over the network or written. It is said only where there are wheels
/// to check, and where the base is another than the recipe's.
fn base_glibc(req: &Request, from: Option<&Transport>) -> Result<Option<(Version, String)>> {
    match from {
        Some(base) if req.engine_build.is_none() => {
            let note = req.from.is_some() && !req.without_python;
            super::fs::glibc_of_base(base, &req.recipe.recipe.base, note)
                .map_err(|e| req.base_error(e))
        }
        _ => Ok(None),
    }
}

/// The lock made whole by the closures it installs (a build of one platform passes its
/// closure as the build's closure), and by the base it is built on.
fn settle(
    lock: &mut Lock,
    closures: &[(Platform, Closure)],
    from: Option<&Transport>,
    req: &Request,
) -> Result<()> {
    let all: Vec<&Closure> = closures.iter().map(|(_, c)| c).collect();
    crate::closure::settle(lock, &all)?;
    if let Some(base) = from {
        lock.built_on(base, req.base_name.as_deref());
    }
    Ok(())
}

/// The build's options from the request, with `closure` as the one Python closure it
/// installs.
fn build_options(
    req: &Request,
    (to, from): (Transport, Option<Transport>),
    cache_dir: PathBuf,
    closure: Option<Closure>,
) -> Result<BuildOptions> {
    let (cache_from, cache_to) = req.layer_caches()?;
    Ok(BuildOptions {
        to,
        from,
        compression: req.compression,
        epoch: super::build::source_date_epoch()?.unwrap_or(0),
        created: super::build::source_date_epoch()?,
        base_name: req.base_name.clone(),
        no_cache: req.no_cache,
        link_blobs: req.link_blobs,
        closure,
        offline: req.offline,
        cache_dir,
        stack_layers: req.stack_layers,
        probe: req.probe.clone(),
        // Only the SBOM lists them: without it the base's layers are not read again.
        base_packages: req.sbom.is_some(),
        startup: None,
        cache_from,
        cache_to,
    })
}

/// A probe recipe (`pytorch: none`): the probe on the base, with the recipe's files and
/// presets; nothing is resolved. What reads or writes what a lock pins is refused at the
/// recipe's `pytorch:`.
fn probe_image(req: &Request) -> Result<BuildReport> {
    let loaded = &req.recipe;
    let lock_flags = [
        (req.pylock.is_some(), "--pylock"),
        (req.lock.is_some(), "--lock"),
        (req.lock_out.is_some(), "--lock-out"),
        (req.sbom.is_some(), "--sbom"),
        (req.key.is_some(), "--key"),
        (req.engine_build.is_some(), "--engine-build"),
        (req.driver.is_some(), "--driver"),
        (req.startup_record.is_some(), "--startup-record"),
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
    let to = req.destination()?;
    let from = match &req.from {
        Some(f) => req.transport(f)?,
        None => req.recipes_base()?,
    };
    let options = Options {
        driver: None,
        preset_dirs: req.preset_dirs.clone(),
        base_glibc: None,
    };
    let probe = resolve::resolve_probe(loaded, &options)?;
    if !req.skip_checks {
        crate::lint::gate(loaded, &options)?;
    }
    let only = req.platform.clone();
    super::build::check_base(&from, Plan::Probe(&probe), only.as_ref(), false)
        .map_err(|e| req.base_error(e))?;
    let cache_dir = crate::wheel::cache::WheelCache::default_root()?;
    let opts = build_options(req, (to, Some(from)), cache_dir, None)?;
    let platforms = PlatformOptions {
        only,
        probes: req.probe_binaries.clone(),
        closures: Vec::new(),
    };
    let resolve_s = req.began.elapsed().as_secs_f64();
    let mut report = super::build_probe(loaded, &probe, &opts, &platforms)?;
    report.timings.resolve_s = resolve_s;
    report.timings.total_s = req.began.elapsed().as_secs_f64();
    Ok(report)
}

/// Each platform's closure: read from its own file or resolved into the cache (none for an
/// image without Python). An error names the recipe's `pip:` entry uv blames, and a hint to
/// resolve again is the command that does it.
fn closures(
    req: &Request,
    lock: &Lock,
    only: Option<&Platform>,
    cache_dir: &Path,
) -> Result<Vec<(Platform, Closure)>> {
    if req.without_python {
        return Ok(Vec::new());
    }
    let source = crate::closure::Source {
        recipe_file: req.recipe_file.as_deref(),
        explicit: req.pylock.as_deref(),
        index: req.recipe.recipe.index.as_deref(),
        offline: req.offline,
        cache_dir,
    };
    crate::closure::for_build_platforms(lock, &source, only)
        .map_err(|e| crate::closure::at_pip_entry(e, &req.recipe))
        .map_err(|e| req.with_resolve_command(e))
}

/// The recipe's `system:` packages, resolved against the base the build reads (`from`; for
/// an engine build without one, the recipe's own from its registry: the Dockerfile installs
/// the same pins). They are pinned for one platform: a recipe for several is refused at the
/// field.
fn system_packages(
    req: &Request,
    from: Option<&Transport>,
    lock: &Lock,
) -> Result<Vec<SystemPackage>> {
    let loaded = &req.recipe;
    let recipe = &loaded.recipe;
    if recipe.system.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(path) = &req.lock {
        return pins_of_lock(path, &recipe.system);
    }
    if req.offline {
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
        None => req.recipes_base()?,
    };
    if req.engine_build.is_some() && !recipe.apt.is_empty() {
        return Err(loaded.doc.invalid(
            &["apt"],
            "--engine-build installs with the base's own apt sources; the recipe's `apt:` \
             archives are read by a daemonless build only",
            Some("build without --engine-build".into()),
        ));
    }
    let [platform] = lock.platforms.as_slice() else {
        return Err(loaded.doc.invalid(
            &["system"],
            format!(
                "system packages are pinned for one platform, and the recipe builds for {}",
                lock.platforms.join(", ")
            ),
            Some("build each platform from its own recipe".into()),
        ));
    };
    let platform: Platform = platform.parse()?;
    let image = base.open_for(&platform)?;
    let dir = req
        .recipe_file
        .as_deref()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    super::system::resolve(&image, loaded, dir)
}

/// The `system:` pins of the lock at `path`, which must have been resolved for the same
/// `asked` (the recipe's `system:`).
fn pins_of_lock(path: &Path, asked: &[String]) -> Result<Vec<SystemPackage>> {
    let doc = crate::document::Document::read(path)?;
    let lock: Lock = doc.parse("lock", |_| None)?;
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

/// The engine-build variant of the bake stage: renders the Dockerfile and has the Docker
/// engine build it.
fn engine_build(
    req: &Request,
    engine_build: &EngineBuild,
    mut lock: Lock,
    to: &Transport,
    from: Option<&Transport>,
) -> Result<EngineBuilt> {
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
            if let Some(name) = &req.base_name {
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
    let (plan, dockerfile) = super::render::ContextPlan::with_dockerfile(
        &req.recipe,
        &lock,
        !req.without_python,
        engine_build.template.as_deref(),
    )?;
    let engine = crate::engine::Engine::connect()?;
    let entries = plan.entries_for_build(
        &req.recipe,
        &lock,
        &dockerfile,
        req.recipe_file.as_deref(),
        req.pylock.as_deref(),
        req.offline,
    )?;
    // The context is streamed to the engine from a file: it holds every wheel.
    let scratch = crate::interrupt::scratch_dir(None, ".gpubake-context-")
        .map_err(|e| Error::writing(std::env::temp_dir(), e))?;
    let tar_path = scratch.path().join("context.tar");
    let file = std::fs::File::create(&tar_path).map_err(|e| Error::writing(&tar_path, e))?;
    let file =
        crate::image::layer::write_tar(&entries, 0, std::io::BufWriter::new(file), &tar_path)?;
    file.into_inner()
        .map_err(|e| Error::writing(&tar_path, e.into_error()))?
        .sync_all()
        .map_err(|e| Error::writing(&tar_path, e))?;
    let start = std::time::Instant::now();
    engine.build(&tar_path, tag, |line| eprintln!("{line}"))?;
    Ok(EngineBuilt {
        tag: tag.clone(),
        host: engine.host().to_string(),
        seconds: start.elapsed().as_secs_f64(),
    })
}
