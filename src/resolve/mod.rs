//! Recipe -> lock. Every PyTorch build in the compatibility database is a candidate; each of
//! the recipe's constraints (PyTorch, CUDA, Python, NCCL, GPU archs, the fleet's driver, the
//! base image's glibc) either admits it or says why not. The newest admitted build wins; when
//! none is admitted, the reasons become an explanation with the relaxations that would work.

mod conflict;
mod probe;

pub use conflict::Conflict;
pub use probe::{ProbeImage, resolve_probe};

use crate::compat::{Arch, Compat, Coverage, Release, Variant, coverage};
use crate::error::{Error, Result};
use crate::lock::{BaseAbi, CudaPin, DriverPin, GpuPin, Lock, NvidiaEnv, Pin, RecipeRef, TorchPin};
use crate::preset::{Catalog, MergedEnv, Origin, Preset, nccl_requirement};
use crate::recipe::{LoadedRecipe, field_help};
use crate::version::{Constraint, Version};
use indexmap::IndexMap;
use std::path::{Path, PathBuf};

/// Inputs besides the recipe.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Overrides the recipe's `driver`: the fleet's oldest driver.
    pub driver: Option<Version>,
    /// Directories searched for presets before the built-in ones.
    pub preset_dirs: Vec<PathBuf>,
    /// The glibc of the base image actually used, with what it was read from; replaces the
    /// guess from the recipe's `base:` text.
    pub base_glibc: Option<(Version, String)>,
}

/// A build of PyTorch: one CUDA variant of one release.
#[derive(Clone, Copy)]
pub struct Candidate<'a> {
    /// The release.
    pub release: &'a Release,
    /// The variant.
    pub variant: &'a Variant,
}

impl Candidate<'_> {
    /// `torch 2.9+cu128`.
    pub fn label(&self) -> String {
        format!("torch {}+{}", self.release.release, self.variant.tag)
    }
}

/// The Python a recipe asks for.
#[derive(Clone, Debug)]
struct PythonAsk {
    constraint: Option<Constraint>,
    free_threaded: bool,
    text: String,
}

impl PythonAsk {
    /// The newest Python of `release` that satisfies the ask.
    fn pick(&self, release: &Release) -> Option<String> {
        let pool = if self.free_threaded {
            &release.free_threaded
        } else {
            &release.python
        };
        pool.iter()
            .filter_map(|p| Some((p.trim_end_matches('t').parse::<Version>().ok()?, p)))
            .filter(|(v, _)| self.constraint.as_ref().is_none_or(|c| c.matches(v)))
            .max_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, p)| p.clone())
    }
}

/// Says why a candidate is refused, or None.
type Refusal<'a> = Box<dyn Fn(&Candidate) -> Option<String> + 'a>;

/// One constraint over candidates: what was asked, and a test that explains a refusal.
pub struct Rule<'a> {
    /// Which recipe field (or preset) it comes from: pytorch, cuda, python, nccl, gpus, driver, glibc.
    pub key: &'static str,
    /// What was asked, as a person would say it: "driver >=550".
    pub asked: String,
    test: Refusal<'a>,
}

impl Rule<'_> {
    /// Why `c` is refused, or None when admitted.
    pub fn refuses(&self, c: &Candidate) -> Option<String> {
        (self.test)(c)
    }
}

/// The outcome of resolving.
pub struct Resolved {
    /// The lock.
    pub lock: Lock,
    /// The preset layers that were merged, in order.
    pub layers: Vec<Preset>,
    /// Every candidate with the reasons it was refused (empty for admitted ones).
    pub considered: Vec<(String, Vec<String>)>,
}

/// The preset layers a recipe names, loaded in application order.
pub fn load_layers(loaded: &LoadedRecipe, opts: &Options) -> Result<Vec<Preset>> {
    let catalog = Catalog::from_env(&opts.preset_dirs);
    let names: Vec<_> = loaded
        .recipe
        .presets
        .iter()
        .enumerate()
        .map(|(i, name)| {
            (
                name.clone(),
                loaded.doc.locate(&["presets", &i.to_string()], false),
            )
        })
        .collect();
    let from_dir = recipe_dir(loaded);
    catalog.layers(&names, from_dir.as_deref())
}

/// The directory relative preset paths are read from: the recipe's own, when it is a file
/// on disk (the built-in recipes are not).
fn recipe_dir(loaded: &LoadedRecipe) -> Option<PathBuf> {
    let path = Path::new(loaded.doc.name());
    path.is_file()
        .then(|| path.parent().map(Path::to_path_buf))
        .flatten()
}

/// The presets merged in order, then the recipe's own `env` on top.
pub fn merge_env(loaded: &LoadedRecipe, layers: &[Preset]) -> MergedEnv {
    let mut env = MergedEnv::from_layers(layers);
    for (name, value) in &loaded.recipe.env.0 {
        // The file name alone, as the lock's `recipe.file`: neither the directory the recipe
        // lies in nor how its path was spelled may reach the lock or the image.
        let mut at = loaded.doc.locate(&["env", name], true);
        if let Some(file) = Path::new(&at.file).file_name() {
            at.file = file.to_string_lossy().into_owned();
        }
        env.set(
            name,
            value,
            Origin {
                by: "recipe".into(),
                at: at.to_string(),
            },
            None,
        );
    }
    env
}

/// Resolves a recipe against the embedded compatibility database.
pub fn resolve_recipe(loaded: &LoadedRecipe, opts: &Options) -> Result<Resolved> {
    let db = Compat::embedded();
    let recipe = &loaded.recipe;
    let doc = &loaded.doc;
    let pytorch = pytorch_ask(loaded)?;
    // Every input is checked before anything is written: a `files:` source that does not
    // exist fails here, in resolve, lint and render alike, not after a build has begun.
    loaded.file_sources()?;
    let layers = load_layers(loaded, opts)?;

    let python = parse_python(loaded)?;
    let gpus = recipe
        .gpus
        .iter()
        .enumerate()
        .map(|(i, name)| {
            // Grace superchips run Arm hosts: an image for them needs linux/arm64 among
            // the recipe's platforms. Refuse rather than lock an image that would never
            // start there.
            if db.arm_host(name) && !recipe.platforms().iter().any(|p| p.architecture == "arm64") {
                return Err(doc.invalid(
                    &["gpus", &i.to_string()],
                    format!(
                        "`{name}` nodes have an Arm (aarch64) host CPU, and the recipe builds \
                         for {} only",
                        recipe
                            .platforms()
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    Some("add `platforms: [linux/amd64, linux/arm64]` to the recipe".into()),
                ));
            }
            db.gpu_arch(name)
                .map(|arch| (name.clone(), arch))
                .ok_or_else(|| {
                    let hint = crate::nccl::suggest::closest(name, db.gpu_models())
                        .map(|s| format!(" (did you mean `{s}`?)"))
                        .unwrap_or_default();
                    doc.invalid(
                        &["gpus", &i.to_string()],
                        format!("unknown GPU `{name}`{hint}"),
                        field_help("gpus"),
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let fleet = match (&opts.driver, &recipe.driver) {
        (Some(v), _) => Some((v.clone(), "--driver".to_string())),
        (None, Some(c)) => Some((
            c.floor().ok_or_else(|| {
                doc.invalid(
                    &["driver"],
                    format!("`{c}` names no lowest driver"),
                    field_help("driver"),
                )
            })?,
            "recipe".to_string(),
        )),
        (None, None) => None,
    };
    let base_glibc = opts.base_glibc.clone().or_else(|| base_glibc(&recipe.base));
    let mut nccl = Vec::new();
    if let Some(c) = &recipe.nccl {
        nccl.push((c.clone(), "recipe".to_string()));
    }
    nccl.extend(nccl_requirement(&layers));

    let rules = rules(
        db,
        pytorch.clone(),
        recipe.cuda.clone(),
        &python,
        &nccl,
        &gpus,
        &fleet,
        &base_glibc,
    );
    let candidates: Vec<Candidate> = db
        .releases
        .iter()
        .flat_map(|release| {
            release
                .variants
                .iter()
                .map(move |variant| Candidate { release, variant })
        })
        .collect();
    let considered: Vec<(String, Vec<String>)> = candidates
        .iter()
        .map(|c| {
            (
                c.label(),
                rules.iter().filter_map(|r| r.refuses(c)).collect(),
            )
        })
        .collect();
    let mut admitted: Vec<Candidate> = candidates
        .iter()
        .zip(&considered)
        .filter(|(_, (_, why))| why.is_empty())
        .map(|(c, _)| *c)
        .collect();
    if admitted.is_empty() {
        return Err(Error::Unsatisfiable(Box::new(Conflict::explain(
            doc.name(),
            &rules,
            &candidates,
        ))));
    }
    // Where NCCL is constrained, a build known to meet it beats one whose pin is unknown.
    let nccl_checked = |c: &Candidate| nccl.is_empty() || c.variant.nccl.is_some();
    admitted.sort_by_key(|c| std::cmp::Reverse((nccl_checked(c), rank(c))));
    let chosen = admitted[0];
    let env = merge_env(loaded, &layers);
    let mut lock = build_lock(
        loaded,
        db,
        chosen,
        &admitted,
        &python,
        &gpus,
        &fleet,
        base_glibc.clone(),
        env,
    );
    for layer in layers.iter().filter(|l| l.shadows_builtin()) {
        lock.warnings.push(format!(
            "preset `{}` is read from {}, which takes the place of the built-in preset of that \
             name (a file in a preset directory or ./env-presets wins)",
            layer.name,
            layer.doc.name()
        ));
    }
    if !nccl_checked(&chosen) {
        let asked: Vec<String> = nccl.iter().map(|(c, by)| format!("`{c}` ({by})")).collect();
        lock.warnings.push(format!(
            "{}'s NCCL pin is unknown, so {} cannot be checked",
            chosen.label(),
            asked.join(", ")
        ));
    }
    Ok(Resolved {
        lock,
        layers,
        considered,
    })
}

/// What the recipe's `pytorch:` asks for; a probe recipe (`pytorch: none`) has nothing to
/// resolve, which is said at the field.
fn pytorch_ask(loaded: &LoadedRecipe) -> Result<&Constraint> {
    loaded.recipe.pytorch.as_ref().ok_or_else(|| {
        loaded.doc.invalid(
            &["pytorch"],
            "`pytorch: none` asks for no Python stack: there is nothing to pin, and no lock",
            Some("`gpubake build RECIPE --to DEST` builds its probe image".into()),
        )
    })
}

/// Newer release first; within one, the PyPI default, then better-confirmed data, then newer CUDA.
fn rank(c: &Candidate) -> (Version, bool, std::cmp::Reverse<usize>, Version) {
    (
        c.release.release.clone(),
        c.variant.pypi_default,
        std::cmp::Reverse(c.variant.unconfirmed.len()),
        c.variant.cuda.clone(),
    )
}

fn parse_python(loaded: &LoadedRecipe) -> Result<PythonAsk> {
    let Some(text) = loaded
        .recipe
        .python
        .as_ref()
        .map(|c| c.as_str().to_string())
    else {
        return Ok(PythonAsk {
            constraint: None,
            free_threaded: false,
            text: "any".into(),
        });
    };
    let free_threaded = text.ends_with('t');
    let constraint = text
        .trim_end_matches('t')
        .parse::<Constraint>()
        .map_err(|e| loaded.doc.invalid(&["python"], e, field_help("python")))?;
    Ok(PythonAsk {
        constraint: Some(constraint),
        free_threaded,
        text,
    })
}

/// Known glibc of common base images, by a word in the image reference.
const BASE_GLIBC: &[(&str, &str)] = &[
    ("ubuntu18.04", "2.27"),
    ("bionic", "2.27"),
    ("ubuntu20.04", "2.31"),
    ("focal", "2.31"),
    ("ubuntu22.04", "2.35"),
    ("jammy", "2.35"),
    ("ubuntu24.04", "2.39"),
    ("noble", "2.39"),
    ("buster", "2.28"),
    ("bullseye", "2.31"),
    ("bookworm", "2.36"),
    ("trixie", "2.41"),
    ("centos7", "2.17"),
    ("ubi8", "2.28"),
    ("rockylinux8", "2.28"),
    ("ubi9", "2.34"),
    ("rockylinux9", "2.34"),
    ("amazonlinux2023", "2.34"),
];

/// The glibc of a base image when its reference names a known distribution release.
pub fn base_glibc(base: &str) -> Option<(Version, String)> {
    let key: String = base
        .to_ascii_lowercase()
        .chars()
        .filter(|c| *c != ':' && *c != '-')
        .collect();
    BASE_GLIBC
        .iter()
        .find(|(word, _)| key.contains(word))
        .map(|(word, v)| {
            (
                v.parse().expect("table versions parse"),
                (*word).to_string(),
            )
        })
}

#[allow(clippy::too_many_arguments)]
fn rules<'a>(
    db: &'a Compat,
    pytorch: Constraint,
    cuda: Option<Constraint>,
    python: &'a PythonAsk,
    nccl: &'a [(Constraint, String)],
    gpus: &'a [(String, Arch)],
    fleet: &'a Option<(Version, String)>,
    base_glibc: &'a Option<(Version, String)>,
) -> Vec<Rule<'a>> {
    let mut rules = vec![Rule {
        key: "pytorch",
        asked: format!("pytorch {pytorch}"),
        test: Box::new(move |c| {
            (!c.release.patches.iter().any(|p| pytorch.matches(p))).then(|| {
                format!(
                    "torch {} does not match pytorch `{pytorch}`",
                    c.release.release
                )
            })
        }),
    }];
    if let Some(cuda) = cuda {
        rules.push(Rule {
            key: "cuda",
            asked: format!("cuda {cuda}"),
            test: Box::new(move |c| {
                (!cuda.matches(&c.variant.cuda))
                    .then(|| format!("{} is CUDA {}, not `{cuda}`", c.variant.tag, c.variant.cuda))
            }),
        });
    }
    if python.constraint.is_some() {
        rules.push(Rule {
            key: "python",
            asked: format!("python {}", python.text),
            test: Box::new(move |c| {
                python.pick(c.release).is_none().then(|| {
                    let pool = if python.free_threaded {
                        &c.release.free_threaded
                    } else {
                        &c.release.python
                    };
                    match (pool.first(), pool.last()) {
                        (Some(lo), Some(hi)) => format!(
                            "torch {} has wheels for Python {lo}..{hi}, not {}",
                            c.release.release, python.text
                        ),
                        _ => format!("torch {} has no free-threaded wheels", c.release.release),
                    }
                })
            }),
        });
    }
    for (constraint, by) in nccl {
        rules.push(Rule {
            key: "nccl",
            asked: format!("nccl {constraint} ({by})"),
            // A build whose NCCL pin the data lacks may well satisfy the constraint: it is
            // admitted, ranked below builds known to satisfy it, and the lock warns.
            test: Box::new(move |c| match &c.variant.nccl {
                Some(v) if !constraint.matches(v) => Some(format!(
                    "{} ships NCCL {v}, not `{constraint}` ({by})",
                    c.label()
                )),
                _ => None,
            }),
        });
    }
    if !gpus.is_empty() {
        let names: Vec<&str> = gpus.iter().map(|(n, _)| n.as_str()).collect();
        rules.push(Rule {
            key: "gpus",
            asked: format!("gpus {}", names.join(", ")),
            test: Box::new(move |c| {
                let missing: Vec<String> = gpus
                    .iter()
                    .filter(|(_, arch)| coverage(&c.variant.archs, c.variant.ptx, *arch).is_none())
                    .map(|(name, arch)| format!("{name} ({arch})"))
                    .collect();
                (!missing.is_empty()).then(|| {
                    let built: Vec<String> = c.variant.archs.iter().map(Arch::to_string).collect();
                    format!(
                        "{} has no code for {}; it is built for {}",
                        c.label(),
                        missing.join(", "),
                        built.join(" ")
                    )
                })
            }),
        });
    }
    if let Some((floor, by)) = fleet {
        rules.push(Rule {
            key: "driver",
            asked: format!("driver >={floor} ({by})"),
            test: Box::new(move |c| {
                let family = db.family_floor(c.variant.cuda.major())?;
                (*floor < family.min_driver).then(|| {
                    format!(
                        "{} needs driver >= {} (CUDA {} minor-version compatibility); the fleet floor is {floor}",
                        c.label(),
                        family.min_driver,
                        c.variant.cuda.major()
                    )
                })
            }),
        });
    }
    if let Some((glibc, distro)) = base_glibc {
        rules.push(Rule {
            key: "glibc",
            asked: format!("base glibc {glibc} ({distro})"),
            test: Box::new(move |c| {
                (*glibc < c.release.glibc).then(|| {
                    format!(
                        "torch {} needs glibc >= {}; the base ({distro}) has {glibc}",
                        c.release.release, c.release.glibc
                    )
                })
            }),
        });
    }
    rules
}

#[allow(clippy::too_many_arguments)]
fn build_lock(
    loaded: &LoadedRecipe,
    db: &Compat,
    chosen: Candidate,
    admitted: &[Candidate],
    python: &PythonAsk,
    gpus: &[(String, Arch)],
    fleet: &Option<(Version, String)>,
    base_glibc: Option<(Version, String)>,
    env: MergedEnv,
) -> Lock {
    let recipe = &loaded.recipe;
    let (release, variant) = (chosen.release, chosen.variant);
    let mut warnings = Vec::new();
    let unconfirmed = |field: &str| variant.unconfirmed.iter().any(|u| u == field);
    if !variant.unconfirmed.is_empty() {
        warnings.push(format!(
            "{}: {} not confirmed from the shipped wheel (secondary sources); `gpubake probe` checks what is installed",
            chosen.label(),
            variant.unconfirmed.join(", ")
        ));
    }

    let patch = release
        .patches
        .iter()
        // The recipe asks for a release here: resolve_recipe refused `pytorch: none`.
        .filter(|p| recipe.pytorch.as_ref().is_none_or(|c| c.matches(p)))
        .max()
        .expect("the pytorch rule admitted this release")
        .clone();
    let torch_rule = torch_rule(&chosen, admitted, &patch);
    let python_pick = python
        .pick(release)
        .expect("the python rule admitted this release");
    let python_rule = python_rule(python, release);

    let driver = driver_pin(db, variant, fleet, &mut warnings);
    let gpu_pins = gpu_pins(gpus, variant, &mut warnings);

    if base_glibc.is_none() {
        warnings.push(format!(
            "the glibc of base `{}` is unknown to gpubake; the wheels need glibc >= {}",
            recipe.base, release.glibc
        ));
    }

    let torch_requirement = format!("torch=={patch}+{}", variant.tag);
    let mut packages = IndexMap::new();
    packages.insert("torch".to_string(), format!("=={patch}+{}", variant.tag));
    if !unconfirmed("requires") {
        for (name, spec) in &variant.requires {
            packages.insert(name.clone(), spec.clone());
        }
    } else {
        warnings.push(format!(
            "{}: the nvidia-* pins are not confirmed, so pip takes them from torch's own metadata",
            chosen.label()
        ));
    }

    let pin = |v: &Option<Version>, field: &str, what: &str| Pin {
        version: v.clone(),
        rule: match v {
            Some(_) => format!("{what} pinned by {}", chosen.label()),
            None => format!(
                "{what} pin of {} is unknown; pip takes what torch's metadata names",
                chosen.label()
            ),
        },
        unconfirmed: unconfirmed(field),
    };
    let nccl = pin(&variant.nccl, "nccl", "NCCL");
    let cudnn = pin(&variant.cudnn, "cudnn", "cuDNN");
    // nvidia-container-toolkit grammar: `,` is AND. The driver must speak the wheel's CUDA
    // major, and be at least the minor-version-compatibility floor of that major.
    let require_cuda = format!("cuda>={}.0,driver>={}", variant.cuda.major(), driver.min);

    let labels = pin_labels(loaded, variant, &patch, &python_pick, &driver.min);

    Lock {
        gpubake: env!("CARGO_PKG_VERSION").to_string(),
        recipe: RecipeRef {
            name: recipe.name.clone(),
            // The file name alone: how the path was spelled must not change the lock, nor
            // the image it goes into.
            file: std::path::Path::new(loaded.doc.name())
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| loaded.doc.name().to_string()),
            sha256: loaded.doc.sha256(),
        },
        base: recipe.base.clone(),
        torch: TorchPin {
            version: patch,
            variant: variant.tag.clone(),
            requirement: torch_requirement,
            index_url: variant.index_url(),
            pypi_default: variant.pypi_default,
            rule: torch_rule,
        },
        python: Pin {
            version: Some(
                python_pick
                    .trim_end_matches('t')
                    .parse()
                    .expect("python versions parse"),
            ),
            rule: python_rule,
            unconfirmed: false,
        },
        cuda: CudaPin {
            version: variant.cuda.clone(),
            runtime: variant.cuda_runtime.clone(),
            cublas: variant.cublas.clone(),
            toolkit: variant.cuda_toolkit.clone(),
            rule: format!("the CUDA {} build {}", variant.cuda, variant.tag),
        },
        cudnn,
        nccl,
        driver,
        platform: BaseAbi {
            glibc: release.glibc.clone(),
            cxx11_abi: release.cxx11_abi,
            base_glibc_from: base_glibc.as_ref().map(|(_, from)| from.clone()),
            base_glibc: base_glibc.map(|(v, _)| v),
        },
        platforms: recipe.platforms().iter().map(ToString::to_string).collect(),
        gpus: gpu_pins,
        packages,
        pip: recipe.pip.clone(),
        nvidia: NvidiaEnv {
            visible_devices: "all".into(),
            driver_capabilities: "compute,utility".into(),
            require_cuda,
        },
        env,
        labels,
        warnings,
        system: Vec::new(),
        system_asked: Vec::new(),
        wheels: Vec::new(),
    }
}

/// The driver floor of the build's CUDA major (minor-version compatibility), the driver its
/// toolkit shipped with, and the recipe's fleet floor against them; warnings for a floor
/// that is not confirmed and for a fleet below the toolkit's driver.
fn driver_pin(
    db: &Compat,
    variant: &Variant,
    fleet: &Option<(Version, String)>,
    warnings: &mut Vec<String>,
) -> DriverPin {
    let family = db
        .family_floor(variant.cuda.major())
        .expect("every CUDA major has a floor");
    // What is unconfirmed is the exact number within the floor's driver branch (the branch
    // itself is NVIDIA's word): a fleet floor on a later branch meets every number the floor
    // could be, so the doubt does not concern that fleet and is not repeated on every run.
    let fleet_settles_it = fleet
        .as_ref()
        .is_some_and(|(v, _)| v.major() > family.min_driver.major());
    if family.unconfirmed && !fleet_settles_it {
        warnings.push(format!(
            "driver floor {} for CUDA {}: {}; a fleet floor above the {} branch (`driver:` in \
             the recipe, or --driver) settles it and silences this warning",
            family.min_driver,
            variant.cuda.major(),
            family
                .note
                .as_deref()
                .unwrap_or("exact number not confirmed"),
            family.min_driver.major()
        ));
    }
    let recommended = db.toolkit(&variant.cuda).and_then(|t| t.ga_driver.clone());
    let fleet_version = fleet.as_ref().map(|(v, _)| v.clone());
    if let (Some(f), Some(r)) = (&fleet_version, &recommended)
        && f < r
    {
        warnings.push(format!(
            "the fleet floor {f} is below CUDA {}'s own driver {r}: the image runs through minor-version \
             compatibility, without PTX JIT for code newer than the driver",
            variant.cuda
        ));
    }
    let driver_rule = format!(
        "wheels built with CUDA {} run on drivers >= {} (CUDA {} minor-version compatibility){}",
        variant.cuda,
        family.min_driver,
        variant.cuda.major(),
        match &fleet {
            Some((v, by)) => format!("; the fleet floor {v} ({by}) meets it"),
            None => "; the recipe gives no fleet floor (`driver`)".to_string(),
        }
    );
    DriverPin {
        min: family.min_driver.clone(),
        recommended,
        fleet: fleet_version,
        rule: driver_rule,
    }
}

/// Why this torch: the newest release meeting every constraint, its newest matching patch,
/// the build taken, and the next ones admitted.
fn torch_rule(chosen: &Candidate, admitted: &[Candidate], patch: &Version) -> String {
    let (release, variant) = (chosen.release, chosen.variant);
    let others: Vec<String> = admitted
        .iter()
        .skip(1)
        .take(3)
        .map(Candidate::label)
        .collect();
    let variant_why = if variant.pypi_default {
        format!("its PyPI default build {}", variant.tag)
    } else {
        let default = release
            .variants
            .iter()
            .find(|v| v.pypi_default)
            .map(|v| v.tag.as_str())
            .unwrap_or("?");
        format!(
            "{} (the PyPI default {default} does not meet the recipe)",
            variant.tag
        )
    };
    format!(
        "newest release meeting every constraint: {}, newest matching patch {patch}; {variant_why}{}",
        release.release,
        if others.is_empty() {
            String::new()
        } else {
            format!("; also admitted: {}", others.join(", "))
        }
    )
}

/// Why this Python.
fn python_rule(python: &PythonAsk, release: &Release) -> String {
    match &python.constraint {
        Some(_) => format!(
            "newest Python of torch {} matching `{}`",
            release.release, python.text
        ),
        None => format!(
            "newest Python with torch {} wheels (the recipe names none)",
            release.release
        ),
    }
}

/// What each of the recipe's GPUs runs of the build: its own SASS, or PTX the driver compiles
/// at first use (a warning).
fn gpu_pins(gpus: &[(String, Arch)], variant: &Variant, warnings: &mut Vec<String>) -> Vec<GpuPin> {
    gpus.iter()
        .map(|(name, arch)| {
            let runs = match coverage(&variant.archs, variant.ptx, *arch) {
                Some(Coverage::Sass(a)) => a.to_string(),
                Some(Coverage::Ptx(a)) => {
                    warnings.push(format!(
                        "{name} ({arch}) runs only PTX for {a}: the driver compiles it at first use, which is slow"
                    ));
                    format!("compute_{}{} (PTX)", a.major, a.minor)
                }
                None => unreachable!("the gpus rule admitted this build"),
            };
            GpuPin { name: name.clone(), arch: arch.to_string(), runs }
        })
        .collect()
}

/// The image's labels: OCI's title, description and base, the pins, then the recipe's own
/// (which win).
fn pin_labels(
    loaded: &LoadedRecipe,
    variant: &Variant,
    patch: &Version,
    python: &str,
    min_driver: &Version,
) -> IndexMap<String, String> {
    let recipe = &loaded.recipe;
    let mut labels = IndexMap::new();
    let mut label = |k: &str, v: String| {
        labels.insert(k.to_string(), v);
    };
    label("org.opencontainers.image.title", recipe.name.clone());
    if let Some(d) = &recipe.description {
        label("org.opencontainers.image.description", d.clone());
    }
    label("org.opencontainers.image.base.name", recipe.base.clone());
    label("io.gpubake.recipe.sha256", loaded.doc.sha256());
    label("io.gpubake.torch", format!("{patch}+{}", variant.tag));
    label("io.gpubake.cuda", variant.cuda.to_string());
    label("io.gpubake.python", python.to_string());
    if let Some(v) = &variant.nccl {
        label("io.gpubake.nccl", v.to_string());
    }
    if let Some(v) = &variant.cudnn {
        label("io.gpubake.cudnn", v.to_string());
    }
    label("io.gpubake.driver.min", min_driver.to_string());
    for (k, v) in &recipe.labels.0 {
        labels.insert(k.clone(), v.clone());
    }
    labels
}
