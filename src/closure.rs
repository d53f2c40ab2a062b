//! The Python closure of a lock: every wheel the image installs, each with its URL, size and
//! sha256, as a PEP 751 lock (`pylock.<name>.toml`) resolved for the image's platform rather
//! than the host's.
//!
//! uv is the resolver front-end: it evaluates markers for the target interpreter and expands
//! manylinux tags, which pip does not do for a foreign platform. gpubake checks what uv chose
//! against the lock's pins and records the inputs of the resolution in `[tool.gpubake]`, so a
//! closure that no longer matches its recipe is refused instead of silently installed.

use crate::error::{Error, Result};
use crate::lock::{Lock, WheelChoice};
use crate::names::normalize;
use crate::version::Version;
use crate::wheel::cache::WheelRef;
use crate::wheel::tags::Target;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The manylinux targets uv can resolve for, oldest first (glibc major, minor).
const MANYLINUX: &[(u64, u64)] = &[
    (2, 17),
    (2, 28),
    (2, 31),
    (2, 32),
    (2, 33),
    (2, 34),
    (2, 35),
    (2, 36),
    (2, 37),
    (2, 38),
    (2, 39),
    (2, 40),
];

/// How long one resolution may take before it is called hung.
const UV_DEADLINE: Duration = Duration::from_secs(600);

/// A PEP 751 lock file, as far as gpubake reads it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Pylock {
    /// The format version (`1.0`).
    pub lock_version: String,
    /// What wrote it.
    #[serde(default)]
    pub created_by: Option<String>,
    /// The Python versions it is for.
    #[serde(default)]
    pub requires_python: Option<String>,
    /// Every package of the closure.
    #[serde(default)]
    pub packages: Vec<Package>,
    /// Tool tables; gpubake keeps the inputs of the resolution in `tool.gpubake`.
    #[serde(default)]
    pub tool: BTreeMap<String, toml::Value>,
}

/// One package of the closure.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Package {
    /// The distribution name.
    pub name: String,
    /// The exact version.
    #[serde(default)]
    pub version: Option<String>,
    /// Its wheels; a lock for one platform lists exactly one.
    #[serde(default)]
    pub wheels: Vec<WheelEntry>,
    /// A source distribution, which gpubake never builds.
    #[serde(default)]
    pub sdist: Option<toml::Value>,
}

/// One wheel file of a package.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct WheelEntry {
    /// The file name, when not the last segment of the URL.
    #[serde(default)]
    pub name: Option<String>,
    /// Where to download it.
    #[serde(default)]
    pub url: Option<String>,
    /// Its size in bytes.
    #[serde(default)]
    pub size: Option<u64>,
    /// Its digests by algorithm.
    #[serde(default)]
    pub hashes: BTreeMap<String, String>,
    /// When the index received it (PEP 751 `upload-time`, which uv writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_time: Option<toml::value::Datetime>,
}

/// What a closure was resolved from: if any of it changes, the closure is stale.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Inputs {
    /// The requirements given to the resolver, in order.
    pub requirements: Vec<String>,
    /// The target interpreter (`3.11`).
    pub python: String,
    /// The target platform (`x86_64-manylinux_2_28`).
    pub platform: String,
    /// The indexes, primary first; empty for PyPI.
    pub indexes: Vec<String>,
}

/// A closure read from (or written to) a file, with its inputs checked.
#[derive(Clone, Debug)]
pub struct Closure {
    /// Where it lives.
    pub path: PathBuf,
    /// The file's text, as written.
    pub text: String,
    /// Its content.
    pub pylock: Pylock,
    /// The wheels to install, one per package, in the file's order.
    pub wheels: Vec<WheelRef>,
    /// For each package with several wheels for the platform, the one taken and why.
    pub choices: Vec<WheelChoice>,
}

/// The file name of the closure of recipe `name`, as uv requires it to be spelled.
pub fn file_name(recipe_name: &str) -> String {
    // PEP 751 allows no dots in the name part.
    format!("pylock.{}.toml", recipe_name.replace('.', "-"))
}

/// The file name of the closure of `platform`: `pylock.NAME.toml` while the lock names
/// linux/amd64 alone (as before platforms existed), else one file per platform, named for it
/// (`pylock.NAME-linux-arm64.toml`), so that each is obvious beside the lock.
pub fn file_name_for(lock: &Lock, platform: &crate::image::Platform) -> String {
    if lock.platforms == crate::lock::default_platforms() {
        return file_name(&lock.recipe.name);
    }
    file_name(&format!(
        "{}-{}-{}",
        lock.recipe.name, platform.os, platform.architecture
    ))
}

/// The inputs of a lock's closure for linux/amd64; see [`inputs_for`].
pub fn inputs(lock: &Lock, index: Option<&str>) -> Result<Inputs> {
    inputs_for(lock, index, &amd64())
}

fn amd64() -> crate::image::Platform {
    crate::image::Platform {
        os: "linux".into(),
        architecture: "amd64".into(),
        variant: None,
    }
}

/// The inputs of a lock's closure: PyTorch as the lock pins it, the recipe's extras, and the
/// image's interpreter and platform (the manylinux target of the base's glibc, for the
/// platform's machine).
///
/// What PyPI serves for linux/arm64 (read from PyPI's simple index and each wheel's
/// metadata, PEP 658): torch publishes manylinux aarch64 wheels for every release since 2.2
/// (manylinux2014 through 2.5.1, manylinux_2_28 from 2.6.0). Through 2.10.0 those are CPU
/// builds: every `nvidia-*-cu12` requirement of the torch wheel carries
/// `platform_machine == "x86_64"`, so an aarch64 resolution has no NCCL, cuDNN or CUDA runtime,
/// and [`check_pins`] refuses it. From 2.11.0 the `nvidia-*-cu13` requirements hold on any
/// Linux machine, so aarch64 gets the CUDA 13 stack the lock pins. A CUDA build of an older
/// release for aarch64 comes from an index that serves one (the recipe's `index:`).
pub fn inputs_for(
    lock: &Lock,
    index: Option<&str>,
    platform: &crate::image::Platform,
) -> Result<Inputs> {
    let python_label = lock
        .labels
        .get("io.gpubake.python")
        .cloned()
        .unwrap_or_default();
    if python_label.ends_with('t') {
        return Err(Error::Unsupported(format!(
            "the free-threaded Python {python_label} has no closure support yet: \
             ask for `python: \"{}\"`",
            python_label.trim_end_matches('t')
        )));
    }
    let python = lock
        .python
        .version
        .as_ref()
        .map(Version::to_string)
        .ok_or_else(|| Error::Unsupported("the lock pins no Python version".into()))?;
    // PyPI's build carries no local version label (`+cu128`); every other build comes from
    // the PyTorch index, whose versions do.
    let torch = if lock.torch.pypi_default && index.is_none() {
        format!("torch=={}", lock.torch.version)
    } else {
        lock.torch.requirement.clone()
    };
    let mut requirements = vec![torch];
    requirements.extend(lock.pip.iter().cloned());
    let indexes = match index {
        Some(url) => vec![url.to_string()],
        None if lock.torch.pypi_default => Vec::new(),
        None => vec![lock.torch.index_url.clone()],
    };
    let glibc = lock
        .platform
        .base_glibc
        .as_ref()
        .unwrap_or(&lock.platform.glibc);
    let machine = match platform.architecture.as_str() {
        "amd64" => "x86_64",
        "arm64" => "aarch64",
        other => {
            return Err(Error::Unsupported(format!(
                "no Python closure for {other}: gpubake resolves for {}",
                crate::image::model::BUILDABLE.join(" and ")
            )));
        }
    };
    Ok(Inputs {
        requirements,
        python,
        platform: platform_for(glibc).replacen("x86_64", machine, 1),
        indexes,
    })
}

/// The newest manylinux target uv knows that the base's glibc can run.
fn platform_for(glibc: &Version) -> String {
    let (major, minor) = (glibc.major(), glibc.minor());
    let (a, b) = MANYLINUX
        .iter()
        .rev()
        .find(|(a, b)| (*a, *b) <= (major, minor))
        .copied()
        .unwrap_or(MANYLINUX[0]);
    format!("x86_64-manylinux_{a}_{b}")
}

/// Resolves the closure with uv and writes it to `path` atomically; checks it against the lock
/// first, so a closure that contradicts the lock is never written.
pub fn resolve(lock: &Lock, inputs: &Inputs, path: &Path) -> Result<Closure> {
    let uv = which_uv()?;
    let work = tempfile::tempdir().map_err(|e| Error::writing(std::env::temp_dir(), e))?;
    let req = work.path().join("requirements.in");
    std::fs::write(&req, inputs.requirements.join("\n") + "\n")
        .map_err(|e| Error::writing(&req, e))?;
    let mut cmd = Command::new(&uv);
    cmd.current_dir(work.path())
        .args([
            "pip",
            "compile",
            "requirements.in",
            "--format",
            "pylock.toml",
        ])
        .args(["--python-platform", &inputs.platform])
        .args(["--python-version", &inputs.python])
        .args([
            "--only-binary",
            ":all:",
            "--no-python-downloads",
            "--no-header",
        ])
        .args(["--no-config", "--quiet", "-o", "pylock.toml"]);
    if let Some((primary, rest)) = inputs.indexes.split_first() {
        cmd.args(["--index-url", primary]);
        for extra in rest {
            cmd.args(["--extra-index-url", extra]);
        }
    }
    let stderr = run_bounded(cmd, &uv)?;
    let out = work.path().join("pylock.toml");
    let body = match std::fs::read_to_string(&out) {
        Ok(body) => body,
        Err(_) => return Err(uv_failure(inputs, &stderr)),
    };
    let version = uv_version(&uv);
    let text = format!(
        "# The Python closure of recipe `{}` for {} / CPython {}, resolved by {version}.\n\
         # Written by `gpubake resolve`; do not edit. Every wheel is installed by its sha256.\n\
         {body}\n{}",
        lock.recipe.name,
        inputs.platform,
        inputs.python,
        tool_table(inputs)
    );
    let closure = parse(path, &text)?;
    check_pins(lock, &closure)?;
    crate::fsutil::write_atomic(path, text.as_bytes())?;
    Ok(closure)
}

/// Where a build's closure comes from, and where a resolution it makes is kept.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// The recipe's file, beside which `pylock.NAME.toml` is read (never written).
    pub recipe_file: Option<&'a Path>,
    /// `--pylock FILE`: this closure and no other.
    pub explicit: Option<&'a Path>,
    /// The recipe's `index:`.
    pub index: Option<&'a str>,
    /// Refuse to resolve.
    pub offline: bool,
    /// gpubake's cache root: a build keeps the closures it resolves under `closures/`.
    pub cache_dir: &'a Path,
}

/// The closure a build installs for linux/amd64; see [`for_build_platform`].
pub fn for_build(lock: &Lock, source: &Source) -> Result<Closure> {
    for_build_platform(lock, source, &amd64())
}

/// The closure a build installs for `platform`: `--pylock` when given; else the file beside
/// the recipe when it was resolved for this recipe and this base; else the one a build
/// resolved before for the same inputs, kept in the cache; else a fresh resolution, written
/// to the cache. A build never writes beside the recipe: `resolve -o` writes locks. A file
/// beside the recipe that was resolved for a base with another glibc is resolved again for
/// this base (offline, it is refused, naming the base as the change).
pub fn for_build_platform(
    lock: &Lock,
    source: &Source,
    platform: &crate::image::Platform,
) -> Result<Closure> {
    let inputs = inputs_for(lock, source.index, platform)?;
    if let Some(path) = source.explicit {
        return read(path, lock, &inputs);
    }
    let name = file_name_for(lock, platform);
    let cached = cache_path(source.cache_dir, &name, &inputs);
    let beside = source
        .recipe_file
        .map(|r| r.parent().unwrap_or(Path::new("")).join(&name));
    if let Some(path) = beside.as_ref().filter(|p| p.exists()) {
        match read(path, lock, &inputs) {
            Ok(closure) => return Ok(closure),
            // Only the base changed: the recipe's closure is resolved again for this base.
            Err(_)
                if resolved_for_another_base(path, &inputs)
                    && (!source.offline || cached.exists()) =>
            {
                eprintln!(
                    "note: {} was resolved for another base; this base needs wheels for {}, \
                     so the closure for it comes from the cache (the file is left as it is)",
                    path.display(),
                    inputs.platform
                );
            }
            Err(e) => return Err(e),
        }
    }
    if cached.exists() {
        return read(&cached, lock, &inputs);
    }
    if source.offline {
        // A missing input file, not something the machine lacks: exit 2.
        return Err(Error::Closure(format!(
            "--offline needs the closure: no {} exists for CPython {} / {}; write it with \
             `gpubake resolve RECIPE -o LOCK` where an index is reachable, or pass --pylock FILE",
            beside.map(|p| p.display().to_string()).unwrap_or(name),
            inputs.python,
            inputs.platform
        )));
    }
    let dir = cached.parent().expect("cache paths have a directory");
    std::fs::create_dir_all(dir).map_err(|e| Error::writing(dir, e))?;
    let closure = resolve(lock, &inputs, &cached)?;
    eprintln!("resolved the closure into {}", cached.display());
    Ok(closure)
}

/// `resolve -o`'s closures: each of the lock's platforms resolved with uv for its own machine
/// and written to `explicit` (`--pylock FILE`, for a lock of one platform), else beside the
/// lock in `dir` as [`file_name_for`] names it; then the lock is settled on them (see
/// [`settle`]). Each must hold the lock's pins: a platform whose wheels do not is refused,
/// naming it, rather than given another stack.
pub fn resolve_platforms(
    lock: &mut Lock,
    index: Option<&str>,
    explicit: Option<&Path>,
    dir: &Path,
) -> Result<()> {
    let platforms = lock.platforms();
    one_file_one_platform(
        explicit,
        platforms.len(),
        &format!("{} platforms", platforms.len()),
        "to write one file per platform beside the lock",
    )?;
    let closures = each_platform(&platforms, platforms.len(), |platform| {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => dir.join(file_name_for(lock, platform)),
        };
        let closure =
            inputs_for(lock, index, platform).and_then(|inputs| resolve(lock, &inputs, &path))?;
        let bytes: u64 = closure.wheels.iter().filter_map(|w| w.size).sum();
        eprintln!(
            "wrote {}: {} wheels, {}",
            path.display(),
            closure.wheels.len(),
            crate::units::human_size(bytes)
        );
        Ok(closure)
    })?;
    settle(lock, &closures.iter().collect::<Vec<_>>())
}

/// The closures a build installs: one per platform it builds (`only`, else every platform
/// of the lock), each found as [`for_build_platform`] finds it.
pub fn for_build_platforms(
    lock: &Lock,
    source: &Source,
    only: Option<&crate::image::Platform>,
) -> Result<Vec<(crate::image::Platform, Closure)>> {
    let locked = lock.platforms();
    let chosen = match only {
        Some(p) => vec![p.clone()],
        None => locked.clone(),
    };
    one_file_one_platform(
        source.explicit,
        chosen.len(),
        &lock.platforms.join(", "),
        "(each platform's file is read beside the recipe) or build one platform with --platform",
    )?;
    each_platform(&chosen, locked.len(), |platform| {
        let closure = for_build_platform(lock, source, platform)?;
        Ok((platform.clone(), closure))
    })
}

/// Refuses `--pylock FILE` for `count` platforms' closures when that is more than one: one
/// file holds one closure. `builds_for` says what the recipe builds for, `way_out` what to
/// do instead of `--pylock`.
fn one_file_one_platform(
    explicit: Option<&Path>,
    count: usize,
    builds_for: &str,
    way_out: &str,
) -> Result<()> {
    if explicit.is_some() && count > 1 {
        return Err(Error::Usage(format!(
            "--pylock names one file, and the recipe builds for {builds_for}, each with its \
             own closure; leave --pylock out {way_out}"
        )));
    }
    Ok(())
}

/// `one` for each platform in order, stopping at the first error, which says which platform
/// it is about (see [`for_platform`]); `count` is how many platforms the lock has.
fn each_platform<T>(
    platforms: &[crate::image::Platform],
    count: usize,
    mut one: impl FnMut(&crate::image::Platform) -> Result<T>,
) -> Result<Vec<T>> {
    platforms
        .iter()
        .map(|platform| one(platform).map_err(|e| for_platform(e, platform, count)))
        .collect()
}

/// A closure error of one of several platforms, saying which; for linux/arm64, what PyPI's
/// aarch64 torch wheels are (see [`inputs_for`]).
fn for_platform(e: Error, platform: &crate::image::Platform, count: usize) -> Error {
    match e {
        Error::Closure(m) if count > 1 || platform.architecture != "amd64" => {
            let hint = if platform.architecture == "arm64" {
                "\nnote: PyPI's aarch64 torch wheels are CPU builds through 2.10 (their nvidia-* \
                 requirements are for x86_64 only); from 2.11 they require the CUDA 13 wheels on \
                 aarch64 too. Ask for pytorch >=2.11, or set the recipe's `index:` to one that \
                 serves CUDA builds for aarch64."
            } else {
                ""
            };
            Error::Closure(format!("{platform}: {m}{hint}"))
        }
        other => other,
    }
}

/// Writes `lock` to `path` and each platform's closure beside it, named as `resolve -o`
/// names them: what `build --lock-out` keeps of a build.
pub fn write_lock(
    lock: &Lock,
    closures: &[(crate::image::Platform, Closure)],
    path: &Path,
) -> Result<()> {
    crate::fsutil::output_target(path)?;
    let dir = path.parent().unwrap_or(Path::new(""));
    for (platform, closure) in closures {
        let beside = dir.join(file_name_for(lock, platform));
        crate::fsutil::write_atomic(&beside, closure.text.as_bytes())?;
        eprintln!("wrote {}", beside.display());
    }
    crate::fsutil::write_atomic(path, lock.to_yaml().as_bytes())?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Where a build keeps the closure `name` it resolved from `inputs`: one directory per
/// set of inputs, so that a change of base or recipe never reads another's.
fn cache_path(cache_dir: &Path, name: &str, inputs: &Inputs) -> PathBuf {
    use sha2::Digest as _;
    let key = serde_json::to_vec(inputs).expect("inputs serialize");
    let digest = hex::encode(sha2::Sha256::digest(&key));
    cache_dir.join("closures").join(&digest[..32]).join(name)
}

/// True when the closure at `path` was resolved from the same requirements, interpreter
/// and indexes as `inputs`, for another platform: the base's glibc changed, not the recipe.
fn resolved_for_another_base(path: &Path, inputs: &Inputs) -> bool {
    let recorded = read_text(path)
        .ok()
        .and_then(|t| toml::from_str::<Pylock>(&t).ok())
        .and_then(|p| recorded_inputs(&p));
    recorded.is_some_and(|r| other_base(&r, inputs))
}

fn other_base(recorded: &Inputs, inputs: &Inputs) -> bool {
    recorded.platform != inputs.platform
        && recorded.requirements == inputs.requirements
        && recorded.python == inputs.python
        && recorded.indexes == inputs.indexes
}

/// Reads a closure and checks that it was resolved from `inputs` and agrees with the lock.
pub fn read(path: &Path, lock: &Lock, inputs: &Inputs) -> Result<Closure> {
    let text = read_text(path)?;
    let closure = parse(path, &text)?;
    let recorded = recorded_inputs(&closure.pylock).ok_or_else(|| {
        Error::Closure(format!(
            "{}: no [tool.gpubake] table says what it was resolved from; \
             write it with `gpubake resolve RECIPE -o LOCK`",
            path.display()
        ))
    })?;
    if other_base(&recorded, inputs) {
        let glibc = lock
            .platform
            .base_glibc
            .as_ref()
            .map(|v| {
                format!(
                    "glibc {v}{}",
                    lock.platform
                        .base_glibc_from
                        .as_ref()
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                )
            })
            .unwrap_or_else(|| format!("glibc {}", lock.platform.glibc));
        return Err(Error::Closure(format!(
            "{} was resolved for {}, and this build's base has {glibc}, so its wheels are \
             chosen for {}: the base changed, not the recipe; build without --offline (the \
             closure is resolved for this base into the cache), or write one for this base \
             with `gpubake resolve RECIPE -o LOCK` on a recipe whose `base:` names it",
            path.display(),
            recorded.platform,
            inputs.platform
        )));
    }
    if recorded != *inputs {
        return Err(Error::Closure(format!(
            "{} is stale: it was resolved for {}, the recipe now asks for {}; \
             run `gpubake resolve RECIPE -o LOCK` again",
            path.display(),
            describe(&recorded),
            describe(inputs)
        )));
    }
    check_pins(lock, &closure)?;
    Ok(closure)
}

fn describe(inputs: &Inputs) -> String {
    format!(
        "[{}] on CPython {} / {}{}",
        inputs.requirements.join(", "),
        inputs.python,
        inputs.platform,
        if inputs.indexes.is_empty() {
            String::new()
        } else {
            format!(" from {}", inputs.indexes.join(", "))
        }
    )
}

/// The most a pylock may hold: torch's closure is about 15 KB, so anything near this is not
/// a lock and is refused before it is parsed.
const MAX_PYLOCK: u64 = 16 << 20;

/// Reads a pylock's text, refusing a file too large to be one.
pub fn read_text(path: &Path) -> Result<String> {
    let size = std::fs::metadata(path)
        .map_err(|e| Error::reading(path, e))?
        .len();
    if size > MAX_PYLOCK {
        return Err(Error::Closure(format!(
            "{}: {size} bytes, more than the {MAX_PYLOCK} a pylock may hold",
            path.display()
        )));
    }
    std::fs::read_to_string(path).map_err(|e| Error::reading(path, e))
}

/// Parses PEP 751 text and lists its wheels; refuses anything gpubake cannot install by hash.
pub fn parse(path: &Path, text: &str) -> Result<Closure> {
    let at = path.display().to_string();
    let pylock: Pylock = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
            .unwrap_or(0);
        Error::Closure(format!("{at}:{line}: not a PEP 751 lock: {}", e.message()))
    })?;
    if !pylock.lock_version.starts_with("1.") {
        return Err(Error::Closure(format!(
            "{at}: lock-version {} is not one gpubake reads (1.x)",
            pylock.lock_version
        )));
    }
    let target =
        recorded_inputs(&pylock).and_then(|i| Some((Target::parse(&i.python, &i.platform)?, i)));
    let mut wheels = Vec::new();
    let mut choices = Vec::new();
    for (i, p) in pylock.packages.iter().enumerate() {
        let field = format!("{at}: packages[{i}] ({})", p.name);
        let version = p
            .version
            .clone()
            .ok_or_else(|| Error::Closure(format!("{field}: no exact version")))?;
        let wheel = match p.wheels.as_slice() {
            [one] => one,
            [] if p.sdist.is_some() => {
                return Err(Error::Closure(format!(
                    "{field}: only a source distribution; gpubake installs wheels only"
                )));
            }
            [] => return Err(Error::Closure(format!("{field}: no wheel"))),
            many => {
                let (chosen, choice) = choose_wheel(&field, p, many, target.as_ref())?;
                choices.push(choice);
                chosen
            }
        };
        let url = wheel
            .url
            .clone()
            .ok_or_else(|| Error::Closure(format!("{field}: the wheel has no url")))?;
        let sha256 = wheel
            .hashes
            .get("sha256")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| Error::Closure(format!("{field}: the wheel has no sha256")))?;
        wheels.push(WheelRef {
            name: p.name.clone(),
            version,
            url,
            size: wheel.size,
            sha256: sha256.to_ascii_lowercase(),
        });
    }
    Ok(Closure {
        path: path.to_path_buf(),
        text: text.to_string(),
        pylock,
        wheels,
        choices,
    })
}

/// The file name of a wheel entry: its `name`, else the last segment of its URL.
fn entry_file_name(entry: &WheelEntry) -> String {
    entry.name.clone().unwrap_or_else(|| {
        WheelRef {
            name: String::new(),
            version: String::new(),
            url: entry.url.clone().unwrap_or_default(),
            size: None,
            sha256: String::new(),
        }
        .file_name()
    })
}

/// The wheel an installer takes among a package's several wheels for the closure's target
/// (see [`crate::wheel::tags`]), with the choice as the lock records it.
fn choose_wheel<'a>(
    field: &str,
    package: &Package,
    many: &'a [WheelEntry],
    target: Option<&(Target, Inputs)>,
) -> Result<(&'a WheelEntry, WheelChoice)> {
    let Some((target, inputs)) = target else {
        return Err(Error::Closure(format!(
            "{field}: {} wheels, and no [tool.gpubake] table names the interpreter and \
             platform to choose one for; write the closure with `gpubake resolve RECIPE -o LOCK`",
            many.len()
        )));
    };
    let names: Vec<String> = many.iter().map(entry_file_name).collect();
    let Some((best, fits)) = crate::wheel::tags::choose(&names, target) else {
        return Err(Error::Closure(format!(
            "{field}: none of its {} wheels ({}) runs on CPython {} / {}",
            many.len(),
            names.join(", "),
            inputs.python,
            inputs.platform
        )));
    };
    let describe = |i: usize| {
        let rank = &fits.iter().find(|(j, _)| *j == i).expect("ranked").1;
        format!(
            "{} (tag {}, place {}{})",
            names[i],
            rank.tag,
            rank.place,
            rank.build
                .as_ref()
                .map(|b| format!(", build {b}"))
                .unwrap_or_default()
        )
    };
    let others: Vec<String> = fits
        .iter()
        .filter(|(i, _)| *i != best)
        .map(|(i, _)| describe(*i))
        .collect();
    let unfit = many.len() - fits.len();
    let rule = format!(
        "the installer's choice for CPython {} on {}: the most specific tag, then the higher \
         build tag; {} over {}{}",
        inputs.python,
        inputs.platform,
        describe(best),
        if others.is_empty() {
            "no other fitting wheel".to_string()
        } else {
            others.join(", ")
        },
        if unfit > 0 {
            format!(" ({unfit} more do not run there)")
        } else {
            String::new()
        }
    );
    Ok((
        &many[best],
        WheelChoice {
            package: package.name.clone(),
            platform: inputs.platform.clone(),
            wheel: names[best].clone(),
            rule,
        },
    ))
}

fn tool_table(inputs: &Inputs) -> String {
    let mut gpubake = toml::Table::new();
    gpubake.insert(
        "gpubake".into(),
        toml::Value::try_from(inputs).expect("inputs serialize"),
    );
    let mut tool = toml::Table::new();
    tool.insert("tool".into(), toml::Value::Table(gpubake));
    toml::to_string(&tool).expect("tables serialize")
}

impl Closure {
    /// What it was resolved from, as its `[tool.gpubake]` table says.
    pub fn inputs(&self) -> Option<Inputs> {
        recorded_inputs(&self.pylock)
    }

    /// The newest upload time among the wheels it installs, as a Unix timestamp; None when
    /// the lock records none (PEP 751 makes `upload-time` optional).
    pub fn newest_upload(&self) -> Option<u64> {
        let installed: std::collections::HashSet<&str> =
            self.wheels.iter().map(|w| w.url.as_str()).collect();
        self.pylock
            .packages
            .iter()
            .flat_map(|p| &p.wheels)
            .filter(|w| w.url.as_deref().is_some_and(|u| installed.contains(u)))
            .filter_map(|w| w.upload_time.as_ref())
            .filter_map(|t| crate::units::parse_rfc3339(&t.to_string()))
            .max()
    }
}

fn recorded_inputs(pylock: &Pylock) -> Option<Inputs> {
    pylock.tool.get("gpubake")?.clone().try_into().ok()
}

/// The closure must agree with every exact pin of the lock: torch, NCCL, cuDNN, the CUDA
/// runtime and cuBLAS, and each `==` requirement. A pin the database marks unconfirmed gives
/// way to the closure, which was read from the wheels' own metadata.
pub fn check_pins(lock: &Lock, closure: &Closure) -> Result<()> {
    let found: BTreeMap<String, &WheelRef> = closure
        .wheels
        .iter()
        .map(|w| (normalize(&w.name), w))
        .collect();
    let mut wanted: Vec<(String, String, bool)> = Vec::new();
    wanted.push(("torch".into(), lock.torch.version.to_string(), false));
    for (name, spec) in &lock.packages {
        let bare = name.split('[').next().unwrap_or(name);
        if bare != "torch"
            && let Some(v) = spec.strip_prefix("==")
        {
            wanted.push((bare.to_string(), v.to_string(), false));
        }
    }
    let suffix = format!("cu{}", lock.cuda.version.major());
    let mut library = |base: &str, pin: Option<String>, unconfirmed: bool| {
        if let Some(v) = pin {
            let suffixed = format!("{base}-{suffix}");
            let name = if found.contains_key(&suffixed) || !found.contains_key(base) {
                suffixed
            } else {
                base.to_string()
            };
            wanted.push((name, v, unconfirmed));
        }
    };
    library(
        "nvidia-nccl",
        lock.nccl.version.as_ref().map(Version::to_string),
        lock.nccl.unconfirmed,
    );
    library(
        "nvidia-cudnn",
        lock.cudnn.version.as_ref().map(Version::to_string),
        lock.cudnn.unconfirmed,
    );
    library("nvidia-cuda-runtime", lock.cuda.runtime.clone(), false);
    library("nvidia-cublas", lock.cuda.cublas.clone(), false);
    let mut problems = Vec::new();
    for (name, want, unconfirmed) in wanted {
        let key = normalize(&name);
        match found.get(&key) {
            Some(w) if same_version(&w.version, &want) => {}
            Some(w) if unconfirmed => eprintln!(
                "warning: the lock's {name} {want} is unconfirmed data; the closure resolved {} \
                 from the wheels' metadata",
                w.version
            ),
            Some(w) => problems.push(format!(
                "{name}: the lock pins {want}, the closure has {}",
                w.version
            )),
            None if key == "torch" || !unconfirmed => problems.push(format!(
                "{name}: the lock pins {want}, the closure has none"
            )),
            None => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Closure(format!(
            "{} disagrees with the lock of recipe `{}` ({}):\n  {}",
            closure.path.display(),
            lock.recipe.name,
            lock.recipe.file,
            problems.join("\n  ")
        )))
    }
}

/// Makes the lock name what the closures hold (the first is the lock's own platform's):
/// every range the lock still carries (`cuda-bindings <14,>=13.0.3`) becomes the closure's
/// exact version; NCCL, cuDNN, the CUDA runtime, cuBLAS and the `cuda-toolkit` metapackage
/// are pinned under the names this release's wheels really use (`nvidia-nccl-cu12`,
/// `nvidia-cublas` behind `cuda-toolkit[cublas]`); a pin the data lacks or did not confirm
/// takes the closure's version, read from the wheels' metadata; and every wheel chosen among
/// several is recorded. A pin the lock promises that the closure cannot fill is an error
/// naming the release.
pub fn settle(lock: &mut Lock, closures: &[&Closure]) -> Result<()> {
    let Some(closure) = closures.first() else {
        return Ok(());
    };
    let found = |name: &str| {
        closure
            .wheels
            .iter()
            .find(|w| normalize(&w.name) == normalize(name))
    };
    let release = format!("torch {}+{}", lock.torch.version, lock.torch.variant);
    let suffix = format!("cu{}", lock.cuda.version.major());
    let mut problems = Vec::new();
    let mut pins: Vec<(String, String)> = Vec::new();
    let mut library = |what: &str,
                       base: &str,
                       suffixed: bool,
                       promised: Option<String>,
                       unconfirmed: bool|
     -> Option<String> {
        let names = if suffixed {
            vec![format!("{base}-{suffix}"), base.to_string()]
        } else {
            vec![base.to_string()]
        };
        match names.iter().find_map(|n| found(n)) {
            Some(w) => {
                pins.push((w.name.clone(), w.version.clone()));
                Some(w.version.clone())
            }
            None => {
                if let Some(v) = &promised
                    && !unconfirmed
                {
                    problems.push(format!(
                        "{release}: the lock pins {what} {v}, and the closure has no {}",
                        names.join(" or ")
                    ));
                }
                None
            }
        }
    };
    let nccl = library(
        "NCCL",
        "nvidia-nccl",
        true,
        lock.nccl.version.as_ref().map(Version::to_string),
        lock.nccl.unconfirmed,
    );
    let cudnn = library(
        "cuDNN",
        "nvidia-cudnn",
        true,
        lock.cudnn.version.as_ref().map(Version::to_string),
        lock.cudnn.unconfirmed,
    );
    let runtime = library(
        "the CUDA runtime",
        "nvidia-cuda-runtime",
        true,
        lock.cuda.runtime.clone(),
        false,
    );
    let cublas = library(
        "cuBLAS",
        "nvidia-cublas",
        true,
        lock.cuda.cublas.clone(),
        false,
    );
    let toolkit = library(
        "the cuda-toolkit metapackage",
        "cuda-toolkit",
        false,
        lock.cuda.toolkit.clone(),
        false,
    );
    if !problems.is_empty() {
        return Err(Error::Closure(format!(
            "{} cannot fill the pins of the lock of recipe `{}` ({}):\n  {}",
            closure.path.display(),
            lock.recipe.name,
            lock.recipe.file,
            problems.join("\n  ")
        )));
    }
    let from_closure = |pin: &mut crate::lock::Pin,
                        v: Option<String>,
                        what: &str,
                        label: &str,
                        labels: &mut indexmap::IndexMap<String, String>| {
        let Some(v) = v else { return };
        let Ok(version) = v.parse::<Version>() else {
            return;
        };
        if pin.version.as_ref() != Some(&version) || pin.unconfirmed {
            pin.rule = format!("{what} {v} as the closure resolved it from the wheels' metadata");
            pin.version = Some(version);
            pin.unconfirmed = false;
            labels.insert(label.to_string(), v);
        }
    };
    from_closure(
        &mut lock.nccl,
        nccl,
        "NCCL",
        "io.gpubake.nccl",
        &mut lock.labels,
    );
    from_closure(
        &mut lock.cudnn,
        cudnn,
        "cuDNN",
        "io.gpubake.cudnn",
        &mut lock.labels,
    );
    lock.cuda.runtime = runtime.or(lock.cuda.runtime.take());
    lock.cuda.cublas = cublas.or(lock.cuda.cublas.take());
    lock.cuda.toolkit = toolkit.or(lock.cuda.toolkit.take());
    for (name, spec) in lock.packages.iter_mut() {
        if spec.starts_with("==") {
            continue;
        }
        if let Some(w) = found(name.split('[').next().unwrap_or(name)) {
            *spec = format!("=={}", w.version);
        }
    }
    for (name, version) in pins {
        let have = lock
            .packages
            .keys()
            .any(|k| normalize(k.split('[').next().unwrap_or(k)) == normalize(&name));
        if !have {
            lock.packages.insert(name, format!("=={version}"));
        }
    }
    lock.wheels = closures.iter().flat_map(|c| c.choices.clone()).collect();
    Ok(())
}

/// Versions equal as PEP 440 releases; a local label (`+cu128`) on only one side is ignored,
/// since PyPI's default build has none.
fn same_version(a: &str, b: &str) -> bool {
    let (a_pub, a_local) = a.split_once('+').map_or((a, None), |(p, l)| (p, Some(l)));
    let (b_pub, b_local) = b.split_once('+').map_or((b, None), |(p, l)| (p, Some(l)));
    let release = |v: &str| -> Vec<String> {
        let mut parts: Vec<String> = v
            .split('.')
            .map(|p| p.trim_start_matches('0').to_string())
            .collect();
        while parts.last().is_some_and(String::is_empty) {
            parts.pop();
        }
        parts
    };
    release(a_pub) == release(b_pub)
        && match (a_local, b_local) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        }
}

fn which_uv() -> Result<PathBuf> {
    let name = std::env::var_os("GPUBAKE_UV").unwrap_or_else(|| "uv".into());
    let candidate = PathBuf::from(&name);
    if candidate.components().count() > 1 {
        return Ok(candidate);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(&candidate))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Environment(
                "uv is not on PATH: gpubake resolves the Python closure with it. Install it with \
                 `python3 -m pip install uv` (scripts/setup does), or build from an existing \
                 pylock, which needs no uv"
                    .into(),
            )
        })
}

fn uv_version(uv: &Path) -> String {
    Command::new(uv)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "uv".into())
}

/// Runs uv with a deadline; returns its standard error.
fn run_bounded(mut cmd: Command, uv: &Path) -> Result<String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(uv, e))?;
    let mut pipe = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut s);
        s
    });
    let start = Instant::now();
    loop {
        if child.try_wait().map_err(|e| Error::io(uv, e))?.is_some() {
            break;
        }
        if start.elapsed() > UV_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Environment(format!(
                "uv did not finish resolving within {} s",
                UV_DEADLINE.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(reader.join().unwrap_or_default())
}

/// Tells an index that cannot be reached (the environment, exit 3) from a resolution that has
/// no answer (the recipe, exit 2).
fn uv_failure(inputs: &Inputs, stderr: &str) -> Error {
    let text = stderr.trim();
    let unreachable = [
        "Failed to fetch",
        "error sending request",
        "dns error",
        "Connection refused",
        "connection refused",
        "timed out",
        "Could not connect",
    ]
    .iter()
    .any(|m| text.contains(m));
    let index = if inputs.indexes.is_empty() {
        "PyPI".to_string()
    } else {
        inputs.indexes.join(", ")
    };
    if unreachable {
        Error::Environment(format!(
            "the package index {index} cannot be reached, so the closure cannot be resolved \
             (set `index:` in the recipe to a mirror that serves these wheels):\n{text}"
        ))
    } else {
        Error::Closure(format!(
            "no closure for [{}] on CPython {} / {} from {index}; {UV_SAYS}\n{}",
            inputs.requirements.join(", "),
            inputs.python,
            inputs.platform,
            uv_said(text)
        ))
    }
}

/// What precedes uv's own words in an error: callers that know the recipe look after it for
/// the requirement uv blames.
pub const UV_SAYS: &str = "uv says:";

/// A closure uv could not resolve, placed at the recipe's `pip:` entry uv names, when it
/// names one: the recipe's line is where the fix goes.
pub fn at_pip_entry(e: Error, loaded: &crate::recipe::LoadedRecipe) -> Error {
    let Error::Closure(message) = &e else {
        return e;
    };
    let Some((_, uv)) = message.split_once(UV_SAYS) else {
        return e;
    };
    let name_of = |req: &str| {
        let end = req
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
            .unwrap_or(req.len());
        normalize(&req[..end])
    };
    let blamed = loaded.recipe.pip.iter().position(|req| {
        let name = name_of(req);
        !name.is_empty()
            && uv
                .split(|c: char| c.is_whitespace() || matches!(c, '`' | '\'' | '"' | ','))
                .any(|word| name_of(word) == name)
    });
    match blamed {
        Some(i) => loaded
            .doc
            .invalid(&["pip", &i.to_string()], message.clone(), None),
        None => e,
    }
}

/// uv's words indented under gpubake's, without the `error:` uv starts with, which would
/// repeat the one gpubake prints.
fn uv_said(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {}", l.strip_prefix("error: ").unwrap_or(l)))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_releases() {
        assert!(same_version("2.9.1", "2.9.1+cu128"));
        assert!(same_version("2.27.5", "2.27.5.0"));
        assert!(!same_version("2.27.5", "2.27.3"));
        assert!(!same_version("2.9.1+cu126", "2.9.1+cu128"));
    }

    #[test]
    fn each_platform_has_its_machine_and_file() {
        let mut lock = crate::resolve::resolve_recipe(
            &crate::recipe::LoadedRecipe::builtin_default(),
            &crate::resolve::Options::default(),
        )
        .unwrap()
        .lock;
        let arm: crate::image::Platform = "linux/arm64".parse().unwrap();
        let amd: crate::image::Platform = "linux/amd64".parse().unwrap();
        let x86 = inputs_for(&lock, None, &amd).unwrap().platform;
        let aarch = inputs_for(&lock, None, &arm).unwrap().platform;
        assert!(x86.starts_with("x86_64-manylinux_2_"), "{x86}");
        assert_eq!(aarch, x86.replace("x86_64", "aarch64"));
        let name = file_name(&lock.recipe.name);
        assert_eq!(file_name_for(&lock, &amd), name);
        lock.platforms = vec!["linux/amd64".into(), "linux/arm64".into()];
        assert_eq!(
            file_name_for(&lock, &arm),
            name.replace(".toml", "-linux-arm64.toml")
        );
        assert_eq!(
            file_name_for(&lock, &amd),
            name.replace(".toml", "-linux-amd64.toml")
        );
    }

    #[test]
    fn the_platform_is_the_newest_the_glibc_runs() {
        assert_eq!(
            platform_for(&"2.36".parse().unwrap()),
            "x86_64-manylinux_2_36"
        );
        assert_eq!(
            platform_for(&"2.30".parse().unwrap()),
            "x86_64-manylinux_2_28"
        );
        assert_eq!(
            platform_for(&"2.17".parse().unwrap()),
            "x86_64-manylinux_2_17"
        );
    }

    #[test]
    fn a_pin_the_closure_cannot_fill_names_the_release_and_the_names_looked_for() {
        let mut lock = crate::resolve::resolve_recipe(
            &crate::recipe::LoadedRecipe::builtin_default(),
            &crate::resolve::Options::default(),
        )
        .unwrap()
        .lock;
        let small = include_str!("../tests/fixtures/pylock.small.toml");
        let closure = parse(Path::new("pylock.small.toml"), small).unwrap();
        let before = lock.clone();
        let err = settle(&mut lock, &[&closure]).unwrap_err().to_string();
        let release = format!("torch {}+{}", lock.torch.version, lock.torch.variant);
        assert!(
            err.contains(&format!(
                "{release}: the lock pins NCCL {}, and the closure has no nvidia-nccl-cu12 or \
                 nvidia-nccl",
                lock.nccl.version.as_ref().unwrap()
            )),
            "{err}"
        );
        assert!(err.contains("cuBLAS"), "{err}");
        // The CUDA runtime is there (nvidia-cuda-runtime-cu12), so it is not named.
        assert!(!err.contains("the CUDA runtime"), "{err}");
        assert_eq!(lock, before, "a refused lock is left as it was");
    }

    #[test]
    fn a_file_too_large_to_be_a_pylock_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pylock.big.toml");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_PYLOCK + 1).unwrap();
        let err = read_text(&path).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("more than the"), "{err}");
    }

    #[test]
    fn locks_without_hashes_or_with_many_wheels_are_refused() {
        let no_hash = "lock-version = \"1.0\"\n[[packages]]\nname = \"a\"\nversion = \"1\"\n\
                       wheels = [{ url = \"https://x/a-1-py3-none-any.whl\", size = 3 }]\n";
        let err = parse(Path::new("p.toml"), no_hash).unwrap_err().to_string();
        assert!(
            err.contains("packages[0] (a): the wheel has no sha256"),
            "{err}"
        );
        let h = "0".repeat(64);
        let two = format!(
            "lock-version = \"1.0\"\n[[packages]]\nname = \"a\"\nversion = \"1\"\nwheels = [\
             {{ url = \"https://x/1.whl\", hashes = {{ sha256 = \"{h}\" }} }},\
             {{ url = \"https://x/2.whl\", hashes = {{ sha256 = \"{h}\" }} }}]\n"
        );
        let err = parse(Path::new("p.toml"), &two).unwrap_err().to_string();
        assert!(err.contains("2 wheels"), "{err}");
        let err = parse(Path::new("p.toml"), "lock-version = 1.0\n[[packages]\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("p.toml:"), "{err}");
    }
}
