//! Lock + base image -> new image, without a daemon: the base's blobs are imported (each
//! verified, each layer scanned for paths that escape the root), three reproducible layers
//! are added (the recipe's files, the gpubake probe binary, the NCCL preset with the lock),
//! and the config gains the merged environment, the NVIDIA variables, the pin labels and a
//! history entry per layer. `index.json` (or the archive) is written last. A probe image
//! (`pytorch: none`) is the same build without a lock: the probe, the recipe's files and
//! presets, and a config whose entrypoint is the probe.

use super::fs::PRESET_PATH_IN_IMAGE;
use super::stack;
use crate::error::{Error, Result};
use crate::image::digest::Digest;
use crate::image::layer::{
    BuiltLayer, Compression, Entry, LayerSpec, LayerTiming, ROOT, Reuse, Source, build_layer_to,
    tree_entries,
};
use crate::image::layout::{Layout, digest_of};
use crate::image::model::{ConfigView, Image, IndexImage, Platform, strings};
use crate::image::stream::EngineStream;
use crate::image::transport::Transport;
use crate::lock::{BASE_NAME, LOCK_PATH_IN_IMAGE, Lock, SystemPackage};
use crate::names::PROBE_PATH_IN_IMAGE;
use crate::preset::MergedEnv;
use crate::recipe::LoadedRecipe;
use crate::resolve::{ProbeImage, Resolved};
use crate::wheel::cache::{FetchOptions, FetchTimes, WheelCache};
use indexmap::IndexMap;
use oci_spec::image::{Descriptor, ImageManifestBuilder, MediaType};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

/// What a build writes over its base: the image of a lock (with the Python stack when a
/// closure comes with it, and the lock itself), or a probe image, which pins nothing and
/// holds no lock.
#[derive(Clone, Copy)]
pub enum Plan<'a> {
    /// A resolved recipe's lock.
    Lock(&'a Lock),
    /// A probe recipe (`pytorch: none`).
    Probe(&'a ProbeImage),
}

impl Plan<'_> {
    /// The lock the image holds, when it is a lock's image.
    fn lock(&self) -> Option<&Lock> {
        match self {
            Plan::Lock(lock) => Some(lock),
            Plan::Probe(_) => None,
        }
    }

    fn name(&self) -> &str {
        match self {
            Plan::Lock(lock) => &lock.recipe.name,
            Plan::Probe(p) => &p.name,
        }
    }

    /// The recipe's base reference.
    fn base(&self) -> &str {
        match self {
            Plan::Lock(lock) => &lock.base,
            Plan::Probe(p) => &p.base,
        }
    }

    /// The platforms as the recipe names them.
    fn platform_names(&self) -> &[String] {
        match self {
            Plan::Lock(lock) => &lock.platforms,
            Plan::Probe(p) => &p.platforms,
        }
    }

    fn platforms(&self) -> Vec<Platform> {
        self.platform_names()
            .iter()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// The merged presets, which go to `/etc/nccl.conf`.
    fn env(&self) -> &MergedEnv {
        match self {
            Plan::Lock(lock) => &lock.env,
            Plan::Probe(p) => &p.env,
        }
    }

    /// Every variable the config sets.
    fn image_env(&self) -> Vec<(String, String)> {
        match self {
            Plan::Lock(lock) => lock.image_env(),
            Plan::Probe(p) => p.image_env(),
        }
    }

    fn labels(&self) -> &IndexMap<String, String> {
        match self {
            Plan::Lock(lock) => &lock.labels,
            Plan::Probe(p) => &p.labels,
        }
    }

    /// The OS packages installed on the base (none in a probe image).
    fn system(&self) -> &[SystemPackage] {
        self.lock().map_or(&[], |l| &l.system)
    }
}

/// How to build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// The destination.
    pub to: Transport,
    /// The base, overriding the recipe's `base`.
    pub from: Option<Transport>,
    /// Layer compression.
    pub compression: Compression,
    /// The timestamp of every new file (`SOURCE_DATE_EPOCH`, else 0): one value for every
    /// image, so that images share the layers of the wheels they share.
    pub epoch: u64,
    /// The image's creation time: `SOURCE_DATE_EPOCH` when set; None dates the image by its
    /// inputs ([`image_created`]).
    pub created: Option<u64>,
    /// The registry reference the base given as `from` is a copy of (`--base-name`): the
    /// image names it as its base. Without it, only a base pulled by the recipe's own
    /// reference is named.
    pub base_name: Option<String>,
    /// Write every layer again instead of taking it from a cache.
    pub no_cache: bool,
    /// Let a layout destination and gpubake's layer cache hold one file per blob by hard
    /// link (`--link-blobs`) rather than each its own (reflink, else copy).
    pub link_blobs: bool,
    /// The Python closure to install; None builds an image without the Python stack.
    pub closure: Option<crate::closure::Closure>,
    /// Build from the wheel cache alone.
    pub offline: bool,
    /// gpubake's cache ([`WheelCache::default_root`] for the user's): the wheels, and the
    /// layers of images built for a destination other than an OCI layout.
    pub cache_dir: std::path::PathBuf,
    /// The most layers the Python stack may take.
    pub stack_layers: usize,
    /// The gpubake binary the image gets as its probe (the running one, for the CLI).
    pub probe: std::path::PathBuf,
    /// Read the base's dpkg packages for the SBOM ([`BuildReport::base_packages`]); off,
    /// the base's layers are not read for them.
    pub base_packages: bool,
    /// The record of a job's start-up that orders eStargz and zstd:chunked layers (see
    /// [`super::prefetch`]), with the file it was read from.
    pub startup: Option<(std::path::PathBuf, crate::startup::StartupRecord)>,
    /// Registry layer caches to take layers from, in order (`--cache-from`).
    pub cache_from: Vec<crate::image::registry::Remote>,
    /// The registry layer cache to record the layers in (`--cache-to`).
    pub cache_to: Option<crate::image::registry::Remote>,
}

/// One layer of the result.
#[derive(Debug, Serialize)]
pub struct LayerLine {
    /// `base`, `files`, `probe` or `presets`.
    pub name: String,
    /// Its digest.
    pub digest: String,
    /// Compressed size.
    pub size: u64,
    /// Taken from the cache or the base rather than written now.
    pub reused: bool,
    /// Where it came from: `base`, `written`, `local-cache` or `registry-cache`.
    pub from: &'static str,
    /// How its blob went between an oci: layout and the layer cache: `reflink`, `copy` or
    /// `link` (`--link-blobs`); absent where it did not (the cache had it, or the
    /// destination is not a layout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placed: Option<crate::fsutil::Placement>,
    /// Where the time went, for a layer written now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing: Option<LayerTiming>,
}

/// Where a build's time went, phase by phase (each layer's own is in its [`LayerLine`]).
#[derive(Debug, Default, Serialize)]
pub struct BuildTimings {
    /// Seconds before the first layer: resolving the recipe and its closure, checking the
    /// base (the command measures it; zero for a library caller that did not).
    pub resolve_s: f64,
    /// Seconds reading the base and importing its blobs.
    pub base_s: f64,
    /// The wheels' download and verification.
    pub fetch: FetchTimes,
    /// Seconds writing the layers (the OS layer's, the stack's, the recipe's), fetching
    /// included.
    pub layers_s: f64,
    /// Seconds putting the image where it goes: a layout's tag, the archive, the engine's
    /// load, the registry's push.
    pub transfer_s: f64,
    /// Seconds of the whole build, from the command's start when it measured one.
    pub total_s: f64,
}

/// What a build produced.
#[derive(Debug, Serialize)]
pub struct BuildReport {
    /// The destination.
    pub image: String,
    /// The manifest's digest.
    pub manifest: Digest,
    /// The base's manifest digest.
    pub base: Digest,
    /// The config's digest.
    pub config: Digest,
    /// Every layer, base first (of the first platform, for an index).
    pub layers: Vec<LayerLine>,
    /// Each platform's manifest, when the recipe names its platforms.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub platforms: Vec<PlatformLine>,
    /// What went to the engine, for a build into one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineLayers>,
    /// The image's creation time (of the first platform, for an index), RFC 3339.
    pub created: String,
    /// The registry reference the image names as its base, when the build knows one.
    pub base_name: Option<String>,
    /// Where the time went.
    pub timings: BuildTimings,
    /// The packages the base's dpkg lists (of the first platform, for an index), when
    /// [`BuildOptions::base_packages`] asked for them and the base has dpkg: the SBOM's.
    #[serde(skip)]
    pub base_packages: Option<crate::sbom::BasePackages>,
}

/// The layers a build into an engine sent, and those it left out because the engine held
/// them (with every layer below).
#[derive(Debug, Serialize)]
pub struct EngineLayers {
    /// Layers streamed to the engine.
    pub sent: usize,
    /// Layers named but not sent.
    pub left_out: usize,
}

/// The `NAME:TAG` an engine destination loads, `latest` when it names no tag.
fn engine_reference(dest: &Transport) -> String {
    match dest {
        Transport::DockerDaemon(r) if r.contains(':') => r.clone(),
        Transport::DockerDaemon(r) => format!("{r}:latest"),
        other => other.to_string(),
    }
}

/// The timestamp reproducible builds use: `SOURCE_DATE_EPOCH` when set.
pub fn source_date_epoch() -> Result<Option<u64>> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map(Some).map_err(|_| {
            Error::Usage(format!(
                "SOURCE_DATE_EPOCH=`{v}` is not a number of seconds"
            ))
        }),
        _ => Ok(None),
    }
}

/// When the image was made, reproducibly: `given` (`SOURCE_DATE_EPOCH`) when set, else the
/// newest date its inputs carry: the base's `created` and the upload time of every wheel it
/// installs. The same inputs give the same date, and `docker images` says how new the
/// newest part of the image is; 1970 only when no input is dated.
pub fn image_created(
    given: Option<u64>,
    base_config: &Value,
    closure: Option<&crate::closure::Closure>,
) -> u64 {
    given.unwrap_or_else(|| {
        let base = base_config["created"]
            .as_str()
            .and_then(crate::units::parse_rfc3339);
        base.into_iter()
            .chain(closure.and_then(crate::closure::Closure::newest_upload))
            .max()
            .unwrap_or(0)
    })
}

/// Which of the lock's platforms a build makes, and the probe binary of each platform the
/// running binary does not serve.
#[derive(Clone, Debug, Default)]
pub struct PlatformOptions {
    /// Build only this one of the lock's platforms, as a plain manifest (`--platform`).
    pub only: Option<Platform>,
    /// gpubake binaries built for other platforms (`--probe-binary PLATFORM=PATH`).
    pub probes: Vec<(Platform, std::path::PathBuf)>,
    /// Each platform's Python closure, for a build of several platforms with the stack;
    /// a build of one may give its closure in [`BuildOptions::closure`] instead.
    pub closures: Vec<(Platform, crate::closure::Closure)>,
}

/// What one platform's manifest came to.
#[derive(Debug, Serialize)]
pub struct PlatformLine {
    /// `linux/arm64`.
    pub platform: String,
    /// The manifest's digest.
    pub manifest: String,
    /// The config's digest.
    pub config: String,
    /// The base's manifest digest for this platform.
    pub base: String,
}

/// Builds the image for a resolved recipe: every platform of its lock.
pub fn build(
    loaded: &LoadedRecipe,
    resolved: &Resolved,
    opts: &BuildOptions,
) -> Result<BuildReport> {
    build_for(loaded, resolved, opts, &PlatformOptions::default())
}

/// Builds the image for a resolved recipe, for the platforms `platforms` picks. One platform
/// gives a plain manifest; more give an OCI image index with one manifest per platform.
pub fn build_for(
    loaded: &LoadedRecipe,
    resolved: &Resolved,
    opts: &BuildOptions,
    platforms: &PlatformOptions,
) -> Result<BuildReport> {
    build_plan(loaded, Plan::Lock(&resolved.lock), opts, platforms)
}

/// Builds the probe image of a probe recipe (`pytorch: none`), for the platforms `platforms`
/// picks: the base, the recipe's files, the probe, the presets, and `gpubake probe` as what
/// the image runs. `opts.closure` must be None: there is no Python stack to install.
pub fn build_probe(
    loaded: &LoadedRecipe,
    probe: &ProbeImage,
    opts: &BuildOptions,
    platforms: &PlatformOptions,
) -> Result<BuildReport> {
    if opts.closure.is_some() || !platforms.closures.is_empty() {
        return Err(Error::Usage(format!(
            "recipe `{}` asks for `pytorch: none`, a probe image, and a Python closure was \
             given to install",
            probe.name
        )));
    }
    build_plan(loaded, Plan::Probe(probe), opts, platforms)
}

/// Builds the image of `plan` for the platforms `platforms` picks.
fn build_plan(
    loaded: &LoadedRecipe,
    plan: Plan,
    opts: &BuildOptions,
    platforms: &PlatformOptions,
) -> Result<BuildReport> {
    let started = std::time::Instant::now();
    let base_ref = match &opts.from {
        Some(t) => t.clone(),
        // The recipe's `base:` is an image reference (`nvidia/cuda:12.8.1-…`), pulled from its
        // registry, or a transport where it names one.
        None => Transport::of_base(&loaded.recipe.base)?,
    };
    let dest = opts.to.clone().supported()?;
    let targets = target_platforms(plan, platforms)?;
    let multi = targets.len() > 1;
    if multi {
        index_possible(&dest, &targets, opts)?;
    }
    // With the Python stack, every platform has its closure before any work.
    let closures = targets
        .iter()
        .map(|t| closure_for(t, opts, platforms, multi))
        .collect::<Result<Vec<_>>>()?;
    // Every probe binary is found and checked before any work.
    let probes = targets
        .iter()
        .map(|t| probe_for(t, opts, platforms))
        .collect::<Result<Vec<_>>>()?;
    // An archive that could never be written (a device, a directory) is refused before any
    // work, not after the layers.
    if let Transport::DockerArchive { path, .. } = &dest {
        crate::fsutil::output_target(path)?;
    }
    // Fail before any work when an engine is the destination and none answers.
    let engine = match &dest {
        Transport::DockerDaemon(_) => Some(crate::engine::Engine::connect()?),
        _ => None,
    };
    // Destinations other than a layout build in the cache's own layout, so their layers are
    // cached between builds as a layout destination's are.
    // A layout this build creates is its own until the index is written: a build that fails
    // or is interrupted removes it rather than leave blobs without an index.json.
    let mut new_layout = match &dest {
        Transport::Oci { dir, .. } if !dir.exists() => Some(crate::interrupt::Staged::new(dir)),
        _ => None,
    };
    let store = match &dest {
        // A layout takes the layers the cache holds by link, and leaves its own there.
        Transport::Oci { dir, .. } => {
            let cache = Layout::open_cache(&opts.cache_dir.join("layout"))?;
            Layout::create(dir)?.sharing(&cache, opts.link_blobs)
        }
        Transport::DockerDaemon(_) | Transport::DockerArchive { .. } | Transport::Registry(_) => {
            Layout::open_cache(&opts.cache_dir.join("layout"))?
        }
    };
    let _lock = store.lock()?;
    let to_registry = match &dest {
        Transport::Registry(remote) => Some(remote),
        _ => None,
    };
    let registry_cache = registry_cache(opts, to_registry)?;

    // The config names its platform when the recipe chose platforms; a recipe without
    // `platforms:` keeps the base's config as it was, so its digest stays what it was.
    let name_platform = multi || platforms.only.is_some() || !loaded.recipe.platforms.is_empty();
    // The engine reads the image while it is built: each layer it lacks is streamed to it as
    // it is made, uncompressed; the config goes last.
    let engine = engine.map(EngineStream::start).transpose()?;
    let mut built = Vec::new();
    for ((target, probe), closure) in targets.iter().zip(&probes).zip(&closures) {
        let one = build_platform(
            loaded,
            plan,
            opts,
            (&base_ref, &store, engine.as_ref(), registry_cache.as_ref()),
            target,
            (probe, *closure),
            name_platform,
        );
        match one {
            Ok(one) => built.push(one),
            Err(e) => {
                return Err(match engine {
                    Some(engine) => engine.abandon(e),
                    None => e,
                });
            }
        }
    }
    let name = format!("{}:latest", loaded.recipe.name);
    let transfer = std::time::Instant::now();
    let (index_digest, engine_layers) = deliver(&store, &dest, &built, engine, &name)?;
    if let Some(cache) = &opts.cache_to {
        let pushed = match &index_digest {
            Some(index) => index.clone(),
            None => digest_of(&built[0].manifest)?,
        };
        record_layers(
            cache,
            &built,
            opts,
            &store,
            to_registry.map(|r| (r, pushed)),
        )?;
    }
    let first = &built[0];
    let report = BuildReport {
        image: dest.to_string(),
        manifest: match index_digest {
            Some(d) => d,
            None => digest_of(&first.manifest)?,
        },
        base: first.base.clone(),
        config: digest_of(&first.config)?,
        layers: first.lines(),
        platforms: if multi || name_platform {
            built.iter().map(PlatformBuilt::line).collect()
        } else {
            Vec::new()
        },
        engine: engine_layers,
        created: crate::units::rfc3339(first.created),
        base_name: base_name(opts, &base_ref, plan),
        base_packages: first.base_packages.clone(),
        timings: BuildTimings {
            resolve_s: 0.0,
            base_s: built.iter().map(|b| b.base_s).sum(),
            fetch: built
                .iter()
                .fold(FetchTimes::default(), |all, b| all + b.fetch.clone()),
            layers_s: built.iter().map(|b| b.layers_s).sum(),
            transfer_s: transfer.elapsed().as_secs_f64(),
            total_s: started.elapsed().as_secs_f64(),
        },
    };
    if let Some(done) = new_layout.take() {
        done.keep();
    }
    Ok(report)
}

/// Refuses a build of several `targets`, which makes an image index, where `dest` cannot
/// hold one or one closure was given for all.
fn index_possible(dest: &Transport, targets: &[Platform], opts: &BuildOptions) -> Result<()> {
    if let Transport::DockerArchive { .. } | Transport::DockerDaemon(_) = dest {
        let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
        return Err(Error::Usage(format!(
            "{dest}: the recipe builds for {}, which makes an image index, and a docker \
             archive or the Docker Engine holds one platform's image only; build one with \
             --platform {}, or write the index to oci:DIR or docker://",
            names.join(", "),
            names[0]
        )));
    }
    if opts.closure.is_some() {
        return Err(Error::Unsupported(format!(
            "the recipe builds for {} platforms, and one closure was given; each platform \
             installs its own (PlatformOptions::closures)",
            targets.len()
        )));
    }
    Ok(())
}

/// The registry layer caches of `--cache-from`, read, for an image that goes to the registry
/// `destination` if any; None without the option.
fn registry_cache(
    opts: &BuildOptions,
    destination: Option<&crate::image::registry::Remote>,
) -> Result<Option<crate::image::layercache::RegistryCache>> {
    match opts.cache_from.as_slice() {
        [] => Ok(None),
        from => crate::image::layercache::RegistryCache::open(from, destination).map(Some),
    }
}

/// Records the layers of `built` in the registry cache `to` (`--cache-to`), their blobs
/// mounted from the destination, the image `pushed` there, or the caches read, when those
/// are on its registry.
fn record_layers(
    to: &crate::image::registry::Remote,
    built: &[PlatformBuilt],
    opts: &BuildOptions,
    store: &Layout,
    pushed: Option<(&crate::image::registry::Remote, Digest)>,
) -> Result<()> {
    let recorded = crate::image::layercache::Recorded {
        layers: built
            .iter()
            .flat_map(|b| b.built.iter().map(|(_, _, l)| l))
            .collect(),
        compression: opts.compression,
        layout: store,
        pushed,
        mounts: opts.cache_from.iter().collect(),
    };
    let written = crate::image::layercache::write(to, &recorded).inspect_err(|_| {
        eprintln!(
            "{}: the image is written; its layers are not recorded in docker://{}",
            opts.to, to.reference
        )
    })?;
    eprintln!(
        "layer cache docker://{}: {} layers of this build recorded; it holds {} ({})",
        to.reference, written.recorded, written.layers, written.digest
    );
    Ok(())
}

/// Puts what `built` made where it goes: an index of several platforms, the config that ends
/// the engine's stream, or the image written to its destination. Returns the index's digest
/// and what went to the engine, when either applies.
fn deliver(
    store: &Layout,
    dest: &Transport,
    built: &[PlatformBuilt],
    engine: Option<EngineStream>,
    name: &str,
) -> Result<(Option<Digest>, Option<EngineLayers>)> {
    if built.len() > 1 {
        let images = built
            .iter()
            .map(|b| {
                Image::in_layout(store.clone(), &b.manifest, &b.platform, None)
                    .map(|i| i.with_origin(b.origin.clone()))
            })
            .collect::<Result<Vec<_>>>()?;
        let index = IndexImage::write(store, images)?;
        dest.write_index(&index)?;
        return Ok((Some(index.digest().clone()), None));
    }
    let one = &built[0];
    if let Some(engine) = engine {
        let (left_out, sent) = engine.counts();
        match store.read_blob(&digest_of(&one.config)?, Some(one.config.size())) {
            Ok(config) => engine.finish(&config, &engine_reference(dest))?,
            Err(e) => return Err(engine.abandon(e)),
        }
        return Ok((None, Some(EngineLayers { sent, left_out })));
    }
    // The base's blobs stay where it came from: a push to the same registry mounts them.
    let image = Image::in_layout(store.clone(), &one.manifest, &one.platform, None)?
        .with_origin(one.origin.clone());
    dest.write(&image, Some(name))?;
    Ok((None, None))
}

/// The closure `platform` installs: its own from `platforms.closures`, else for a build of one
/// platform the one of the options; None without the Python stack. A multi-platform build
/// with the stack needs one for every platform.
fn closure_for<'a>(
    platform: &Platform,
    opts: &'a BuildOptions,
    platforms: &'a PlatformOptions,
    multi: bool,
) -> Result<Option<&'a crate::closure::Closure>> {
    if let Some((_, c)) = platforms.closures.iter().find(|(p, _)| p.same_as(platform)) {
        return Ok(Some(c));
    }
    if !multi {
        return Ok(opts.closure.as_ref());
    }
    if platforms.closures.is_empty() {
        return Ok(None);
    }
    Err(Error::Usage(format!(
        "no Python closure for {platform}: a build of several platforms with the Python stack \
         installs one closure per platform"
    )))
}

/// The platforms to build: the lock's, or the one `--platform` picks from them.
fn target_platforms(plan: Plan, platforms: &PlatformOptions) -> Result<Vec<Platform>> {
    let locked = plan.platforms();
    if locked.is_empty() {
        return Err(Error::Usage(format!(
            "the lock of recipe `{}` names no platform to build for",
            plan.name()
        )));
    }
    let Some(only) = &platforms.only else {
        return Ok(locked);
    };
    match locked.iter().find(|p| p.same_as(only)) {
        Some(p) => Ok(vec![p.clone()]),
        None => Err(Error::Usage(format!(
            "--platform {only}: the recipe builds for {}; add {only} to its `platforms:` to \
             build for it",
            plan.platform_names().join(", ")
        ))),
    }
}

/// The probe binary for `platform`: the one `--probe-binary` names, checked to be an
/// executable for that platform, else the running binary when it serves the platform.
fn probe_for(
    platform: &Platform,
    opts: &BuildOptions,
    platforms: &PlatformOptions,
) -> Result<std::path::PathBuf> {
    if let Some((_, path)) = platforms.probes.iter().find(|(p, _)| p.same_as(platform)) {
        check_elf(path, platform)?;
        return Ok(path.clone());
    }
    let host = Platform::host();
    if host.same_as(platform) {
        return Ok(opts.probe.clone());
    }
    Err(Error::Usage(format!(
        "the image for {platform} needs a gpubake built for {platform} as its probe, and this \
         one runs on {host}; pass --probe-binary {platform}=PATH"
    )))
}

/// Refuses a file that is not an ELF executable for `platform`'s machine: an image whose
/// probe cannot start would fail every certify on that platform, long after the build.
fn check_elf(path: &Path, platform: &Platform) -> Result<()> {
    let what = format!("--probe-binary {platform}={}", path.display());
    let mut head = [0u8; 20];
    let mut file = std::fs::File::open(path).map_err(|e| Error::reading(path, e))?;
    std::io::Read::read_exact(&mut file, &mut head).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Usage(format!(
                "{what}: the file is too short to be an ELF executable"
            ))
        } else {
            Error::reading(path, e)
        }
    })?;
    if &head[..4] != b"\x7fELF" {
        return Err(Error::Usage(format!(
            "{what}: {} is not an ELF executable",
            path.display()
        )));
    }
    // e_machine sits at offset 18 in both ELF classes, in the byte order EI_DATA names.
    let machine = match head[5] {
        2 => u16::from_be_bytes([head[18], head[19]]),
        _ => u16::from_le_bytes([head[18], head[19]]),
    };
    let name = |m: u16| match m {
        62 => "x86-64 (EM_X86_64)".to_string(),
        183 => "AArch64 (EM_AARCH64)".to_string(),
        other => format!("ELF machine {other}"),
    };
    match platform.elf_machine() {
        Some(want) if want == machine => Ok(()),
        Some(want) => Err(Error::Usage(format!(
            "{what}: {} is built for {}, but {platform} runs {}",
            path.display(),
            name(machine),
            name(want)
        ))),
        None => Err(Error::Usage(format!(
            "{what}: gpubake knows no ELF machine for {platform}"
        ))),
    }
}

/// Checks the base for every platform the build makes, before the closure is resolved and
/// before anything is written: the base holds an image for the platform, and a build with
/// the Python stack finds the lock's CPython in it. (Its glibc is read before the recipe is
/// resolved: the resolution refuses a release the base's glibc cannot run.)
pub fn check_base(
    base_ref: &Transport,
    plan: Plan,
    only: Option<&Platform>,
    with_python: bool,
) -> Result<()> {
    let pick = PlatformOptions {
        only: only.cloned(),
        ..PlatformOptions::default()
    };
    let python = plan.lock().filter(|_| with_python);
    for platform in target_platforms(plan, &pick)? {
        base_for(base_ref, &platform, python)?;
    }
    Ok(())
}

/// The base's image for `platform`, its config, and with the Python stack (`python`, the
/// lock it installs), the CPython the lock pins; refuses a base for another platform or
/// without that interpreter.
fn base_for(
    base_ref: &Transport,
    platform: &Platform,
    python: Option<&Lock>,
) -> Result<(Image, Value, Option<stack::Interpreter>)> {
    let base = base_ref.open_for(platform)?;
    let config_digest = base.manifest().config().digest().to_string();
    let config: Value = serde_json::from_slice(&base.config_bytes()?)
        .map_err(|e| Error::image(base_ref, format!("config {config_digest}: {e}")))?;
    base_diff_ids(&config, base.manifest().layers().len())
        .map_err(|m| Error::image(base_ref, format!("config {config_digest}: {m}")))?;
    // A base whose config names another platform would give an image whose every binary
    // fails with "exec format error" there.
    let base_platform = Platform {
        os: config["os"].as_str().unwrap_or(&platform.os).to_string(),
        architecture: config["architecture"]
            .as_str()
            .unwrap_or(&platform.architecture)
            .to_string(),
        variant: config["variant"].as_str().map(String::from),
    };
    if !platform.accepts(&base_platform) && !base_platform.accepts(platform) {
        return Err(Error::image(
            base_ref,
            format!(
                "the base for {platform} is {base_platform} (config {config_digest}); give a \
                 base image index that holds {platform}, or drop {platform} from the recipe's \
                 `platforms:`"
            ),
        ));
    }
    // The interpreter last: reading the paths reads every layer.
    let python = if let Some(lock) = python {
        let want = lock
            .python
            .version
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let paths = super::fs::paths(&base)?;
        Some(stack::find_python(&paths, &want).map_err(|m| Error::image(base_ref, m))?)
    } else {
        None
    };
    Ok((base, config, python))
}

/// One platform's manifest, as [`build_platform`] wrote it.
struct PlatformBuilt {
    platform: Platform,
    manifest: Descriptor,
    config: Descriptor,
    base: Digest,
    base_layers: Vec<Descriptor>,
    built: Vec<(String, String, BuiltLayer)>,
    origin: Option<crate::image::model::Origin>,
    base_s: f64,
    layers_s: f64,
    fetch: FetchTimes,
    created: u64,
    base_packages: Option<crate::sbom::BasePackages>,
}

impl PlatformBuilt {
    fn lines(&self) -> Vec<LayerLine> {
        let mut lines: Vec<LayerLine> = self
            .base_layers
            .iter()
            .map(|d| LayerLine {
                name: "base".into(),
                digest: d.digest().to_string(),
                size: d.size(),
                reused: true,
                from: "base",
                placed: None,
                timing: None,
            })
            .collect();
        lines.extend(self.built.iter().map(|(name, _, l)| LayerLine {
            name: name.clone(),
            digest: l.descriptor.digest().to_string(),
            size: l.descriptor.size(),
            reused: l.reused(),
            from: match l.from {
                Reuse::Written => "written",
                Reuse::LocalCache => "local-cache",
                Reuse::RegistryCache => "registry-cache",
            },
            placed: l.placed,
            timing: l.timing.clone(),
        }));
        lines
    }

    fn line(&self) -> PlatformLine {
        PlatformLine {
            platform: self.platform.to_string(),
            manifest: self.manifest.digest().to_string(),
            config: self.config.digest().to_string(),
            base: self.base.to_string(),
        }
    }
}

/// Builds one platform's manifest in `store`: the base for that platform, the Python stack,
/// the recipe's layers with `probe` as the probe, and the config.
/// The OS layer of the lock's `system:` pins, when it has any, with its history line. What a
/// package's scripts do that gpubake cannot settle is the recipe's to decide, so it is said
/// at the recipe's `system:`.
fn system_layer(
    loaded: &LoadedRecipe,
    store: &Layout,
    base: &Image,
    pins: &[crate::lock::SystemPackage],
    layers: &super::LayerOptions,
) -> Result<Option<(String, String, BuiltLayer)>> {
    if pins.is_empty() {
        return Ok(None);
    }
    let skip = loaded.recipe.scripts_skipped();
    let (created_by, layer) =
        super::system::build(store, base, pins, &skip, layers).map_err(|e| match e {
            Error::Usage(why) => loaded.doc.invalid(
                &["system"],
                why,
                crate::recipe::field_help("system_scripts"),
            ),
            other => other,
        })?;
    Ok(Some(("system".into(), created_by, layer)))
}

fn build_platform(
    loaded: &LoadedRecipe,
    plan: Plan,
    opts: &BuildOptions,
    (base_ref, store, engine, registry): (
        &Transport,
        &Layout,
        Option<&EngineStream>,
        Option<&crate::image::layercache::RegistryCache>,
    ),
    platform: &Platform,
    (probe, closure): (&Path, Option<&crate::closure::Closure>),
    name_platform: bool,
) -> Result<PlatformBuilt> {
    let dest = &opts.to;
    let base_started = std::time::Instant::now();
    let (base, mut config, python) = base_for(
        base_ref,
        platform,
        plan.lock().filter(|_| closure.is_some()),
    )?;
    if name_platform {
        name_config_platform(&mut config, platform);
    }
    // Base layers rewritten as eStargz or zstd:chunked are read from the base itself; their
    // plain copies would sit in the destination unreferenced.
    let rewrite_base = opts.compression.toc().is_some() && engine.is_none();
    import(&base, store, base_ref, !rewrite_base)?;
    if let Some(engine) = engine {
        stream_base(engine, store, &base, &config, base_ref)?;
    }
    let base_layers = if rewrite_base {
        crate::image::convert::lazy_layers(
            &base,
            store,
            opts.compression,
            &mut config,
            !opts.no_cache,
        )?
    } else {
        base.manifest().layers().clone()
    };
    let base_s = base_started.elapsed().as_secs_f64();

    let layers_started = std::time::Instant::now();
    let specs = layer_specs(loaded, plan, probe)?;
    let mut built: Vec<(String, String, BuiltLayer)> = Vec::new();
    let mut extra_env = Vec::new();
    let cache = WheelCache::open(opts.cache_dir.clone())?;
    let layers = super::LayerOptions {
        compression: opts.compression,
        epoch: opts.epoch,
        use_cache: !opts.no_cache,
        cache: &cache,
        fetch: FetchOptions {
            offline: opts.offline,
            jobs: 4,
        },
        engine,
        registry: registry.map(|r| r as &dyn crate::image::layer::RegistryLayers),
    };
    let base_packages = if opts.base_packages {
        super::system::base_packages(&base)?
    } else {
        None
    };
    let env = plan.image_env();
    if let Some(warning) = super::system::unmet_need(&base, &env, plan.system())? {
        eprintln!("warning: {warning}");
    }
    if let Some(system) = system_layer(loaded, store, &base, plan.system(), &layers)? {
        built.push(system);
    }
    if let (Some(closure), Some(python), Some(lock)) = (closure, &python, plan.lock()) {
        let stack_opts = stack::StackOptions {
            layers: layers.clone(),
            budget: opts.stack_layers,
            extras: lock
                .pip
                .iter()
                .map(|r| crate::names::normalize(requirement_name(r)))
                .collect(),
            startup: opts.startup.as_ref().map(|(at, r)| (at.as_path(), r)),
        };
        for l in stack::build(store, closure, python, &stack_opts)? {
            built.push((l.name, l.created_by, l.layer));
        }
        let base_path = ConfigView::parse(&config)
            .map(|c| c.env())
            .unwrap_or_default()
            .into_iter()
            .find_map(|e| e.strip_prefix("PATH=").map(str::to_string));
        extra_env = stack::image_env(base_path.as_deref());
    }
    for spec in &specs {
        let layer = build_layer_to(&layers.sink(store), spec)?;
        built.push((spec.name.clone(), spec.created_by.clone(), layer));
    }

    let layers_s = layers_started.elapsed().as_secs_f64();
    let created_at = image_created(opts.created, &config, closure);
    let created = crate::units::rfc3339(created_at);
    edit_config(&mut config, plan, &extra_env, &built, &created);
    what_it_is(&mut config, plan, closure.is_some());
    // The base by the digest really used; by name only when the build knows its registry
    // reference: the recipe's, when the base was pulled by it, or `--base-name` (a layout,
    // an archive or the engine is no registry, and naming where on the build host would make
    // the digest depend on it).
    let annotations = name_base(&mut config, base_name(opts, base_ref, plan), &base, created);
    let new_config = store.write_json(&config, MediaType::ImageConfig)?;
    let mut layers: Vec<Descriptor> = base_layers.clone();
    layers.extend(built.iter().map(|(_, _, l)| l.descriptor.clone()));
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(new_config.clone())
        .layers(layers)
        .annotations(annotations)
        .build()
        .map_err(|e| Error::image(dest, e.to_string()))?;
    let mut manifest_desc = store.write_json(&manifest, MediaType::ImageManifest)?;
    if name_platform {
        manifest_desc.set_platform(Some(platform.to_oci()));
    }
    Ok(PlatformBuilt {
        platform: platform.clone(),
        manifest: manifest_desc,
        config: new_config,
        base: base.digest().clone(),
        base_layers,
        built,
        origin: base.origin().cloned(),
        base_s,
        layers_s,
        fetch: cache.times(),
        created: created_at,
        base_packages,
    })
}

/// Sets the config's platform to the one built for; a variant the base had and the platform
/// lacks is dropped, so the config never claims a platform the index does not.
fn name_config_platform(config: &mut Value, platform: &Platform) {
    config["os"] = json!(platform.os);
    config["architecture"] = json!(platform.architecture);
    match &platform.variant {
        Some(v) => config["variant"] = json!(v),
        None => {
            if let Some(c) = config.as_object_mut() {
                c.remove("variant");
            }
        }
    }
}

/// Streams the base's layers to the engine by their diff IDs, which the engine keys them by.
fn stream_base(
    engine: &EngineStream,
    store: &Layout,
    base: &Image,
    config: &Value,
    base_ref: &Transport,
) -> Result<()> {
    let diff_ids = base_diff_ids(config, base.manifest().layers().len())
        .map_err(|m| Error::image(base_ref, m))?;
    for (layer, diff_id) in base.manifest().layers().iter().zip(diff_ids) {
        let diff_id: Digest = diff_id
            .parse()
            .map_err(|e| Error::image(base_ref, format!("diff ID {diff_id}: {e}")))?;
        engine.blob(store, layer, &diff_id)?;
    }
    Ok(())
}

/// Names the base in the config's labels (by its registry reference, when the build knows one)
/// and returns the manifest's annotations: the base by digest and by that name, the date.
fn name_base(
    config: &mut Value,
    base_name: Option<String>,
    base: &Image,
    created: String,
) -> HashMap<String, String> {
    if let Some(labels) = config["config"]["Labels"].as_object_mut() {
        match &base_name {
            Some(name) => labels.insert(BASE_NAME.to_string(), json!(name)),
            None => labels.remove(BASE_NAME),
        };
    }
    let mut annotations = HashMap::from([
        (
            "org.opencontainers.image.base.digest".to_string(),
            base.digest().to_string(),
        ),
        ("org.opencontainers.image.created".to_string(), created),
    ]);
    if let Some(name) = base_name {
        annotations.insert(BASE_NAME.to_string(), name);
    }
    annotations
}

/// The registry reference the image names as its base, if the build knows one.
fn base_name(opts: &BuildOptions, base_ref: &Transport, plan: Plan) -> Option<String> {
    opts.base_name.clone().or_else(|| {
        base_ref
            .is_registry_reference(plan.base())
            .then(|| plan.base().to_string())
    })
}

/// The new layers: the recipe's files (large, rarely changed) first, then the probe, then the
/// preset and lock (small, changed most often). A probe image has no lock, and a presets
/// layer only when its recipe sets NCCL variables.
fn layer_specs(loaded: &LoadedRecipe, plan: Plan, probe: &Path) -> Result<Vec<LayerSpec>> {
    let name = plan.name();
    let mut specs = Vec::new();
    if !loaded.recipe.files.is_empty() {
        let mut entries = Vec::new();
        for (src, f) in loaded.file_sources()? {
            entries.extend(tree_entries(&src, &f.dest, f.mode_bits())?);
        }
        specs.push(LayerSpec {
            name: "files".into(),
            created_by: format!("gpubake build: files of recipe {name}"),
            entries,
            prefetch: None,
        });
    }
    specs.push(LayerSpec {
        name: "probe".into(),
        created_by: format!(
            "gpubake build: the gpubake {} probe at {PROBE_PATH_IN_IMAGE}",
            plan.lock()
                .map_or(env!("CARGO_PKG_VERSION"), |l| &l.gpubake)
        ),
        entries: vec![Entry {
            path: rel(PROBE_PATH_IN_IMAGE),
            mode: 0o755,
            owner: ROOT,
            source: Source::File(probe.to_path_buf()),
        }],
        prefetch: None,
    });
    let env = plan.env();
    if plan.lock().is_none() && env.0.is_empty() {
        return Ok(specs);
    }
    let preset = format!(
        "# The merged NCCL preset of recipe `{name}`, with where each value came from.\n{}",
        serde_yaml::to_string(env).expect("env serializes")
    );
    let presets: Vec<&str> = loaded.recipe.presets.iter().map(String::as_str).collect();
    let mut entries = vec![Entry {
        path: "etc/nccl.conf".into(),
        mode: 0o644,
        owner: ROOT,
        source: Source::Bytes(env.nccl_conf().into_bytes()),
    }];
    if let Some(lock) = plan.lock() {
        entries.push(Entry {
            path: rel(LOCK_PATH_IN_IMAGE),
            mode: 0o644,
            owner: ROOT,
            source: Source::Bytes(lock.to_yaml().into_bytes()),
        });
    }
    entries.push(Entry {
        path: rel(PRESET_PATH_IN_IMAGE),
        mode: 0o644,
        owner: ROOT,
        source: Source::Bytes(preset.into_bytes()),
    });
    specs.push(LayerSpec {
        name: "presets".into(),
        created_by: format!(
            "gpubake build: NCCL preset [{}]{}",
            presets.join(", "),
            if plan.lock().is_some() {
                " and lock"
            } else {
                ""
            }
        ),
        entries,
        prefetch: None,
    });
    Ok(specs)
}

/// The distribution name of a requirement (`Transformers[torch]>=4.5` is `Transformers`).
fn requirement_name(req: &str) -> &str {
    let end = req
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(req.len());
    &req[..end]
}

fn rel(path: &str) -> String {
    path.trim_start_matches('/').to_string()
}

/// The diff IDs of a base config that build can extend: the config is a JSON object and
/// `rootfs.diff_ids` a list of strings, one per layer of the manifest.
fn base_diff_ids(config: &Value, layers: usize) -> std::result::Result<Vec<String>, String> {
    if !config.is_object() {
        return Err(format!("is {}, not a JSON object", json_kind(config)));
    }
    let Some(list) = config["rootfs"]["diff_ids"].as_array() else {
        return Err("has no rootfs.diff_ids list (the layers' uncompressed digests)".into());
    };
    let mut diff_ids = Vec::new();
    for (i, d) in list.iter().enumerate() {
        match d.as_str() {
            Some(d) => diff_ids.push(d.to_string()),
            None => {
                return Err(format!(
                    "rootfs.diff_ids[{i}] is {}, not a string",
                    json_kind(d)
                ));
            }
        }
    }
    if diff_ids.len() != layers {
        return Err(format!(
            "lists {} diff_ids for {layers} layers",
            diff_ids.len()
        ));
    }
    Ok(diff_ids)
}

/// What kind of JSON value `v` is, for messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Extends the base config: environment, labels, diff IDs, history, creation time. The config
/// must have passed [`base_diff_ids`]. It is edited as JSON, not through oci-spec's types:
/// the fields those do not model (Docker's among them) must survive the edit.
fn edit_config(
    config: &mut Value,
    plan: Plan,
    extra_env: &[(String, String)],
    built: &[(String, String, BuiltLayer)],
    created: &str,
) {
    if !config["config"].is_object() {
        config["config"] = json!({});
    }
    let mut env: Vec<String> = strings(&config["config"]["Env"]);
    for (name, value) in plan
        .image_env()
        .into_iter()
        .chain(extra_env.iter().cloned())
    {
        let line = format!("{name}={value}");
        match env
            .iter_mut()
            .find(|e| e.split_once('=').map(|(k, _)| k) == Some(name.as_str()))
        {
            Some(existing) => *existing = line,
            None => env.push(line),
        }
    }
    config["config"]["Env"] = json!(env);
    if !config["config"]["Labels"].is_object() {
        config["config"]["Labels"] = json!({});
    }
    for (k, v) in plan.labels() {
        config["config"]["Labels"][k] = json!(v);
    }
    let mut diff_ids = strings(&config["rootfs"]["diff_ids"]);
    let mut history: Vec<Value> = match config["history"].as_array() {
        Some(h) => h.clone(),
        None => (0..diff_ids.len())
            .map(|i| json!({"created_by": format!("base image {}, layer {}", plan.base(), i + 1)}))
            .collect(),
    };
    for (name, created_by, layer) in built {
        diff_ids.push(layer.diff_id.to_string());
        history.push(json!({
            "created": created,
            "created_by": created_by,
            "comment": format!("gpubake {} layer", name),
        }));
    }
    config["rootfs"]["diff_ids"] = json!(diff_ids);
    config["history"] = Value::Array(history);
    config["created"] = json!(created);
}

/// Says in the config what the image is: where its Python stack is (`none` without one),
/// and for a probe image, the probe as what it runs.
fn what_it_is(config: &mut Value, plan: Plan, stack: bool) {
    let (key, value) = stack::stack_label(stack);
    config["config"]["Labels"][key] = json!(value);
    if let Plan::Probe(_) = plan {
        // What a DaemonSet or a prolog runs by default: level 1, the node's checks, since
        // levels 2 and 3 run the CUDA toolkit's NVRTC and cuBLAS, which a probe image does
        // not hold. `docker run IMAGE probe --json` passes flags, and the image's other
        // commands stay reachable.
        config["config"]["Entrypoint"] = json!([PROBE_PATH_IN_IMAGE]);
        config["config"]["Cmd"] = json!(["probe", "--level", "1"]);
    }
}

/// Copies the base's config and layers (unless `layers` is false) into `store`, unless
/// present. Each layer is verified against its digest and its diff ID, and scanned for
/// entries that would escape the root.
fn import(base: &Image, store: &Layout, base_ref: &Transport, layers: bool) -> Result<()> {
    if base.store().root() == store.root() {
        return Ok(());
    }
    let config = base.manifest().config();
    let digest = digest_of(config)?;
    if !store.has_blob(&digest, config.size()) {
        store.write_blob(&base.config_bytes()?)?;
    }
    for layer in base.layers() {
        let digest = layer.digest()?;
        if !layers {
            layer.scan().map_err(|e| Error::image(base_ref, e))?;
            continue;
        }
        if store.has_blob(&digest, layer.size()) {
            continue;
        }
        let mut w = store.blob_writer()?;
        std::io::copy(&mut layer.compressed()?, &mut w).map_err(|e| {
            // A full destination is the destination's problem, not the base's.
            if crate::error::out_of_space(&e) {
                Error::writing_needing(store.root().join("blobs/sha256"), e, layer.size())
            } else {
                Error::image(base_ref, e.to_string())
            }
        })?;
        w.commit()?;
        if let Err(e) = layer.scan() {
            let _ = std::fs::remove_file(store.blob_path(&digest));
            return Err(Error::image(base_ref, e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every class of input to the image's date: SOURCE_DATE_EPOCH given or not; the base
    /// dated, undated or unreadable; the closure absent, undated, or with wheels newer and
    /// older than the base, and a listed wheel the build does not install.
    #[test]
    fn the_image_is_dated_by_its_newest_input_unless_source_date_epoch_is_set() {
        let small = crate::closure::parse(
            Path::new("pylock.small.toml"),
            include_str!("../../tests/fixtures/pylock.small.toml"),
        )
        .unwrap();
        // markupsafe's wheel, uploaded 2026-10-02T23:04:41Z, is the newest of the fixture.
        let newest_wheel = crate::units::parse_rfc3339("2026-10-02T23:04:41Z").unwrap();
        assert_eq!(small.newest_upload(), Some(newest_wheel));
        let mut undated = small.clone();
        for p in &mut undated.pylock.packages {
            for w in &mut p.wheels {
                w.upload_time = None;
            }
        }
        assert_eq!(undated.newest_upload(), None);
        // A wheel the lock lists but the build does not install does not date the image.
        let mut listed_only = small.clone();
        listed_only.wheels.retain(|w| w.name != "markupsafe");
        assert!(listed_only.newest_upload().unwrap() < newest_wheel);

        let old_base = json!({"created": "2024-01-02T03:04:05Z"});
        let new_base = json!({"created": "2026-11-30T00:00:00+01:00"});
        let new_base_at = crate::units::parse_rfc3339("2026-11-29T23:00:00Z").unwrap();
        for (given, base, closure, want) in [
            (Some(7), &new_base, Some(&small), 7),
            (Some(0), &new_base, None, 0),
            (None, &old_base, Some(&small), newest_wheel),
            (None, &new_base, Some(&small), new_base_at),
            (None, &new_base, None, new_base_at),
            (None, &json!({}), Some(&small), newest_wheel),
            (None, &json!({"created": "yesterday"}), Some(&undated), 0),
            (None, &json!({}), None, 0),
        ] {
            assert_eq!(
                image_created(given, base, closure),
                want,
                "{given:?} {base} {:?}",
                closure.map(|c| c.newest_upload())
            );
        }
    }

    #[test]
    fn only_the_recipes_own_registry_reference_is_its_base() {
        let t = |s: &str| -> Transport { s.parse().unwrap() };
        for (from, recipe, same) in [
            (
                "docker://docker.io/library/debian:bookworm",
                "debian:bookworm",
                true,
            ),
            (
                "docker://registry.example:5000/team/base:1",
                "registry.example:5000/team/base:1",
                true,
            ),
            (
                "docker://docker.io/library/debian:trixie",
                "debian:bookworm",
                false,
            ),
            ("oci:./base:bookworm", "debian:bookworm", false),
            ("docker-daemon:debian:bookworm", "debian:bookworm", false),
        ] {
            assert_eq!(
                t(from).is_registry_reference(recipe),
                same,
                "{from} for {recipe}"
            );
        }
    }
}
