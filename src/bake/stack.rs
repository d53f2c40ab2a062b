//! The locked Python stack as image layers, installed without pip or a container.
//!
//! Where: a virtual environment at [`VENV`] over the base's own CPython. A fixed path that
//! gpubake owns keeps the stack out of the distribution's `dist-packages` (a PEP 668 base
//! stays intact and `apt` never fights pip over a file), makes the layers independent of
//! where a distribution puts its site-packages, and lets two images on different bases
//! share the torch and nvidia layers byte for byte.
//!
//! How: least-changing first. One layer per wheel of 32 MB or more (torch, cudnn, cublas,
//! nccl, ...: they change together with PyTorch and pull in parallel), the small `nvidia-*`
//! wheels together, the rest of the closure, then the recipe's own extras. A layer depends
//! only on its wheels' sha256, the install scheme and the layer writer's version, so it is
//! found in the cache without opening a wheel.

use crate::closure::Closure;
use crate::error::{Error, Result};
use crate::image::layer::{BuiltLayer, Entry, LayerSpec, ROOT, Source, build_keyed_to};
use crate::image::layout::Layout;
use crate::names::{VENV, normalize};
use crate::wheel::cache::{FetchOptions, WheelCache, WheelRef};
use crate::wheel::install::{self, Scheme};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Wheels at least this large get a layer of their own.
const BIG_WHEEL: u64 = 32 << 20;

/// Registries refuse single layers much beyond this.
const MAX_LAYER: u64 = 8 << 30;

/// Changes whenever the bytes a wheel layer holds would change for the same wheels.
const WRITER: &str = concat!("gpubake-wheel-layer-v1 ", env!("CARGO_PKG_VERSION"));

/// The base's CPython that the environment runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// Its path in the image (`/usr/bin/python3.11`).
    pub path: String,
    /// Its `major.minor`.
    pub version: String,
}

/// Finds CPython `want` (`3.11`) among the base's paths; names what the base has otherwise.
pub fn find_python(paths: &[String], want: &str) -> std::result::Result<Interpreter, String> {
    let mut found: Vec<Interpreter> = Vec::new();
    for dir in ["usr/local/bin/", "usr/bin/"] {
        for p in paths {
            let Some(name) = p.strip_prefix(dir) else {
                continue;
            };
            let Some(ver) = name.strip_prefix("python") else {
                continue;
            };
            let mut parts = ver.split('.');
            let ok = parts.next() == Some("3")
                && parts
                    .next()
                    .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
                && parts.next().is_none();
            if ok {
                found.push(Interpreter {
                    path: format!("/{p}"),
                    version: ver.to_string(),
                });
            }
        }
    }
    if let Some(hit) = found.iter().find(|i| i.version == want) {
        return Ok(hit.clone());
    }
    if found.is_empty() {
        return Err(format!(
            "the base has no CPython in /usr/local/bin or /usr/bin; the lock needs CPython {want}: \
             use a base with python{want}"
        ));
    }
    let have: Vec<String> = found
        .iter()
        .map(|i| format!("CPython {} ({})", i.version, i.path))
        .collect();
    Err(format!(
        "the base has {}, but the lock pins CPython {want}: set `python: \"{}\"` in the recipe, \
         or use a base with python{want}",
        have.join(", "),
        found[0].version
    ))
}

/// One planned layer of wheels.
#[derive(Clone, Debug)]
pub struct WheelLayer {
    /// Its name in reports and history.
    pub name: String,
    /// Its wheels, in closure order.
    pub wheels: Vec<WheelRef>,
}

/// The fewest layers a stack takes: the venv, the small nvidia wheels, the rest of the
/// closure and the recipe's extras; a budget below it cannot be honoured.
pub const MIN_STACK_LAYERS: usize = 4;

/// Groups the closure's wheels into layers, least-changing first, within `budget` layers
/// (the venv's counted).
/// `extras` are the normalized names of the recipe's own `pip:` requirements.
pub fn plan(wheels: &[WheelRef], extras: &[String], budget: usize) -> Result<Vec<WheelLayer>> {
    if budget < MIN_STACK_LAYERS {
        return Err(Error::Usage(format!(
            "--stack-layers {budget}: the stack takes at least {MIN_STACK_LAYERS} layers (the \
             venv, the small nvidia wheels, the rest of the closure, the recipe's extras)"
        )));
    }
    let size = |w: &WheelRef| w.size.unwrap_or(0);
    for w in wheels {
        if size(w) > MAX_LAYER {
            return Err(Error::Wheel {
                wheel: format!("{} {}", w.name, w.version),
                message: format!(
                    "{} bytes: larger than the {} bytes registries take in one layer",
                    size(w),
                    MAX_LAYER
                ),
            });
        }
    }
    let is_extra = |w: &WheelRef| extras.contains(&normalize(&w.name));
    let mut big: Vec<&WheelRef> = wheels
        .iter()
        .filter(|w| size(w) >= BIG_WHEEL && !is_extra(w))
        .collect();
    big.sort_by(|a, b| size(b).cmp(&size(a)).then(a.name.cmp(&b.name)));
    let mut big_extras: Vec<&WheelRef> = wheels
        .iter()
        .filter(|w| size(w) >= BIG_WHEEL && is_extra(w))
        .collect();
    big_extras.sort_by(|a, b| size(b).cmp(&size(a)).then(a.name.cmp(&b.name)));
    // Groups take two to four layers; the big wheels share what is left of the budget,
    // smallest first into their group when it runs out.
    let room = budget - MIN_STACK_LAYERS;
    while big.len() + big_extras.len() > room {
        match (big_extras.is_empty(), big.is_empty()) {
            (false, _) => {
                big_extras.pop();
            }
            (true, false) => {
                big.pop();
            }
            (true, true) => break,
        }
    }
    let own = |w: &WheelRef| {
        big.iter()
            .chain(big_extras.iter())
            .any(|b| b.sha256 == w.sha256)
    };
    let mut nvidia = Vec::new();
    let mut rest = Vec::new();
    let mut extra = Vec::new();
    for w in wheels.iter().filter(|w| !own(w)) {
        if is_extra(w) {
            extra.push(w.clone());
        } else if normalize(&w.name).starts_with("nvidia-") {
            nvidia.push(w.clone());
        } else {
            rest.push(w.clone());
        }
    }
    let mut layers: Vec<WheelLayer> = big
        .iter()
        .map(|w| WheelLayer {
            name: normalize(&w.name),
            wheels: vec![(*w).clone()],
        })
        .collect();
    for (name, group) in [("nvidia", nvidia), ("python", rest)] {
        if !group.is_empty() {
            layers.push(WheelLayer {
                name: name.into(),
                wheels: group,
            });
        }
    }
    layers.extend(big_extras.iter().map(|w| WheelLayer {
        name: normalize(&w.name),
        wheels: vec![(*w).clone()],
    }));
    if !extra.is_empty() {
        layers.push(WheelLayer {
            name: "extras".into(),
            wheels: extra,
        });
    }
    Ok(layers)
}

/// The environment itself: `pyvenv.cfg` and the interpreter links, all that makes `VENV` a
/// virtual environment over the base's CPython.
pub fn venv_entries(python: &Interpreter) -> Vec<Entry> {
    let root = VENV.trim_start_matches('/');
    let home = python
        .path
        .rsplit_once('/')
        .map(|(d, _)| d)
        .unwrap_or("/usr/bin");
    let cfg = format!(
        "home = {home}\ninclude-system-site-packages = false\nversion = {}\nexecutable = {}\n",
        python.version, python.path
    );
    let link = |name: &str, target: &str| Entry {
        path: format!("{root}/{name}"),
        mode: 0o777,
        owner: ROOT,
        source: Source::Symlink(target.to_string()),
    };
    vec![
        Entry {
            path: format!("{root}/pyvenv.cfg"),
            mode: 0o644,
            owner: ROOT,
            source: Source::Bytes(cfg.into_bytes()),
        },
        link("bin/python", &python.path),
        link("bin/python3", "python"),
        link(&format!("bin/python{}", python.version), "python"),
        Entry {
            path: format!("{root}/lib/python{}/site-packages", python.version),
            mode: 0o755,
            owner: ROOT,
            source: Source::Dir,
        },
        link("lib64", "lib"),
    ]
}

/// The label that says whether an image carries the Python stack: the venv's path, or
/// `none` for a preflight image (`--without-python`). Both build paths set it, so `certify`
/// judges their images alike.
pub fn stack_label(stack: bool) -> (&'static str, &'static str) {
    (crate::lock::STACK_LABEL, if stack { VENV } else { "none" })
}

/// The environment the image's config gets: the venv first on PATH.
pub fn image_env(base_path: Option<&str>) -> Vec<(String, String)> {
    let path = base_path.unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    vec![
        ("VIRTUAL_ENV".into(), VENV.into()),
        ("PATH".into(), format!("{VENV}/bin:{path}")),
    ]
}

/// How a stack is built.
pub struct StackOptions<'a> {
    /// How its layers are written and its wheels fetched.
    pub layers: super::LayerOptions<'a>,
    /// The most layers the stack may take.
    pub budget: usize,
    /// Normalized names of the recipe's own requirements.
    pub extras: Vec<String>,
    /// The record of the job's start-up that orders eStargz and zstd:chunked layers, and its
    /// file.
    pub startup: Option<(&'a Path, &'a crate::startup::StartupRecord)>,
}

/// A built layer of the stack, with its name and history line.
pub struct StackLayer {
    /// Its name in reports.
    pub name: String,
    /// Its history line.
    pub created_by: String,
    /// The layer.
    pub layer: BuiltLayer,
}

/// What a wheel layer holds, kept beside the layer cache so that clashes between layers are
/// found without opening the wheels again.
#[derive(Default, Serialize, Deserialize)]
struct FileList(Owners);

/// Each path the stack's layers install, with the wheel (`name version`) and the sha256 of
/// the file it installs there.
type Owners = BTreeMap<String, (String, Option<String>)>;

/// Builds the venv and every wheel layer into `store`. Wheels are fetched only for layers the
/// cache lacks, all at once and in parallel.
pub fn build(
    store: &Layout,
    closure: &Closure,
    python: &Interpreter,
    opts: &StackOptions,
) -> Result<Vec<StackLayer>> {
    let scheme = Scheme::venv(VENV, &python.version);
    let scheme_text = format!(
        "{} {} {} {} {} {}",
        scheme.purelib,
        scheme.platlib,
        scheme.scripts,
        scheme.headers,
        scheme.data,
        scheme.interpreter
    );
    let layers = plan(&closure.wheels, &opts.extras, opts.budget)?;
    let prefetch = opts
        .startup
        .map(|(_, record)| std::sync::Arc::new(super::prefetch::plan(record, &scheme.purelib)));
    let key_of = |l: &WheelLayer| {
        let mut h = Sha256::new();
        h.update(format!("{WRITER}\n{scheme_text}\n"));
        if let Some(p) = &prefetch {
            h.update(format!("prefetch {}\n", p.key()));
        }
        for w in &l.wheels {
            h.update(format!("{}\n", w.sha256));
        }
        hex::encode(h.finalize())
    };
    let list_name = |key: &str| format!("stack/{key}.json");
    let read_list = |key: &str| -> Option<FileList> {
        serde_json::from_slice(&store.read_record(&list_name(key))?).ok()
    };

    let mut out = Vec::new();
    let venv = LayerSpec {
        name: "venv".into(),
        created_by: format!(
            "gpubake build: virtual environment {VENV} over {}",
            python.path
        ),
        entries: venv_entries(python),
        prefetch: prefetch.clone(),
    };
    out.push(StackLayer {
        name: venv.name.clone(),
        created_by: venv.created_by.clone(),
        layer: crate::image::layer::build_layer_to(&opts.layers.sink(store), &venv)?,
    });

    // Which layers must be written: those whose record or file list is missing (a registry
    // cache's hit brings its file list). For an engine, a layer it turns out to lack is
    // written after all, its wheels fetched then.
    let sink = opts.layers.sink(store);
    let keys: Vec<String> = layers.iter().map(key_of).collect();
    let cached: Vec<Option<BuiltLayer>> = keys
        .iter()
        .map(|k| {
            let hit = match opts.layers.engine {
                Some(_) if opts.layers.use_cache => {
                    crate::image::layer::streamed(store, k, opts.layers.epoch)
                }
                Some(_) => None,
                None => sink.lookup(k),
            };
            hit.filter(|_| read_list(k).is_some())
        })
        .collect();
    let missing: Vec<WheelRef> = layers
        .iter()
        .zip(&cached)
        .filter(|(_, c)| c.is_none())
        .flat_map(|(l, _)| l.wheels.iter().cloned())
        .collect();
    // The wheels download (largest first, as the layers are ordered) while the layers whose
    // wheels are in are installed: each layer waits only for its own.
    let arrivals = Arrivals::default();
    std::thread::scope(|scope| {
        let fetching = scope.spawn(|| {
            let fetched = opts
                .layers
                .cache
                .fetch_each(&missing, &opts.layers.fetch, &|i, path| {
                    arrivals.arrive(&missing[i].sha256, path)
                });
            arrivals.end();
            fetched
        });
        let planned = Planned {
            layers: &layers,
            keys: &keys,
            cached,
            missing: &missing,
            scheme: &scheme,
            read_list: &read_list,
            list_name: &list_name,
            prefetch: prefetch.clone(),
        };
        let built = build_layers(store, planned, &arrivals, opts, &mut out);
        let fetched = match fetching.join() {
            Ok(fetched) => fetched,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // A layer that waited in vain waited for a wheel the fetch failed on: its error.
        match (built, fetched) {
            (Err(_), Err(e)) if arrivals.starved() => Err(e),
            (Ok(_), Err(e)) => Err(e),
            (Err(e), _) => Err(e),
            (Ok(held), Ok(_)) => Ok(held),
        }
    })
    .and_then(|held| match opts.startup {
        Some((at, record)) => super::prefetch::check_held(record, at, &scheme.purelib, &held),
        None => Ok(()),
    })?;
    Ok(out)
}

/// The wheels fetched so far, by sha256, for the layers that wait on them.
#[derive(Default)]
struct Arrivals {
    state: std::sync::Mutex<(HashMap<String, PathBuf>, bool)>,
    changed: std::sync::Condvar,
    starved: std::sync::atomic::AtomicBool,
}

impl Arrivals {
    /// Whether a layer gave up on a wheel that never came.
    fn starved(&self) -> bool {
        self.starved.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn arrive(&self, sha256: &str, path: &std::path::Path) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0.insert(sha256.to_string(), path.to_path_buf());
        self.changed.notify_all();
    }

    /// The fetch is over, whether every wheel came or not.
    fn end(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.changed.notify_all();
    }

    /// Waits until every one of `wheels` that is being fetched is in; None when the fetch
    /// ended without one of them. Wheels not being fetched are not waited for.
    fn wait(&self, wheels: &[WheelRef], fetching: &[WheelRef]) -> Option<HashMap<String, PathBuf>> {
        let wanted: Vec<&WheelRef> = wheels
            .iter()
            .filter(|w| fetching.iter().any(|f| f.sha256 == w.sha256))
            .collect();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if wanted.iter().all(|w| s.0.contains_key(&w.sha256)) {
                return Some(s.0.clone());
            }
            if s.1 {
                self.starved
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                return None;
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The wheel layers to write, with what the cache and the fetch know of them.
struct Planned<'a> {
    layers: &'a [WheelLayer],
    keys: &'a [String],
    /// Each layer as the cache holds it, when it does.
    cached: Vec<Option<BuiltLayer>>,
    /// The wheels being fetched.
    missing: &'a [WheelRef],
    scheme: &'a Scheme,
    read_list: &'a dyn Fn(&str) -> Option<FileList>,
    list_name: &'a dyn Fn(&str) -> String,
    /// What a job's start-up reads first, for eStargz layers.
    prefetch: Option<std::sync::Arc<crate::image::layer::Prefetch>>,
}

/// Writes (or finds) each wheel layer in order, each once its wheels have arrived; returns
/// every path the layers hold, with the wheel that installs it.
fn build_layers(
    store: &Layout,
    planned: Planned<'_>,
    arrivals: &Arrivals,
    opts: &StackOptions<'_>,
    out: &mut Vec<StackLayer>,
) -> Result<Owners> {
    let Planned {
        layers,
        keys,
        cached,
        missing,
        scheme,
        read_list,
        list_name,
        prefetch,
    } = planned;
    let mut owners = Owners::new();
    for ((layer, key), hit) in layers.iter().zip(keys).zip(cached) {
        let names: Vec<String> = layer
            .wheels
            .iter()
            .map(|w| format!("{} {}", w.name, w.version))
            .collect();
        let created_by = format!(
            "gpubake build: {} into {VENV}",
            if names.len() == 1 {
                format!("wheel {}", names[0])
            } else {
                format!("{} wheels: {}", names.len(), names.join(", "))
            }
        );
        let installed = std::cell::RefCell::new(None);
        let mut built = match hit {
            // Found above (and its blob adopted, or checked in the registry): not asked again.
            Some(hit) if opts.layers.engine.is_none() => hit,
            _ => build_keyed_to(
                &crate::image::layer::Target {
                    use_cache: opts.layers.use_cache && hit.is_some(),
                    ..opts.layers.sink(store)
                },
                key,
                || {
                    let mut paths = arrivals.wait(&layer.wheels, missing).ok_or_else(|| {
                        Error::Environment("the wheels' fetch ended without this layer's".into())
                    })?;
                    let late: Vec<WheelRef> = layer
                        .wheels
                        .iter()
                        .filter(|w| !paths.contains_key(&w.sha256))
                        .cloned()
                        .collect();
                    if !late.is_empty() {
                        let got = opts.layers.cache.fetch(&late, &opts.layers.fetch)?;
                        paths.extend(late.iter().map(|w| w.sha256.clone()).zip(got));
                    }
                    let (entries, files) = install_all(&layer.wheels, &paths, scheme)?;
                    *installed.borrow_mut() = Some(files);
                    Ok(LayerSpec {
                        name: layer.name.clone(),
                        created_by: created_by.clone(),
                        entries,
                        prefetch: prefetch.clone(),
                    })
                },
            )?,
        };
        built.side_records = vec![list_name(key)];
        let files = match installed.into_inner() {
            Some(files) => {
                store.write_record(
                    &list_name(key),
                    &serde_json::to_vec(&files).expect("file lists serialize"),
                    false,
                )?;
                files
            }
            None => read_list(key).unwrap_or_default(),
        };
        for (path, (owner, sha)) in files.0 {
            claim(&mut owners, path, owner, sha)?;
        }
        out.push(StackLayer {
            name: layer.name.clone(),
            created_by,
            layer: built,
        });
    }
    Ok(owners)
}

/// Plans the installation of `wheels` (each found in `fetched` by sha256) under `scheme`:
/// their layer entries, and which wheel installs which file.
fn install_all(
    wheels: &[WheelRef],
    fetched: &HashMap<String, PathBuf>,
    scheme: &Scheme,
) -> Result<(Vec<Entry>, FileList)> {
    let mut files = FileList::default();
    let mut entries = Vec::new();
    for w in wheels {
        let installed = install::install(&fetched[&w.sha256], scheme, "gpubake")?;
        let owner = format!("{} {}", w.name, w.version);
        for f in installed.files {
            claim(&mut files.0, f.path, owner.clone(), f.sha256)?;
        }
        entries.extend(installed.entries);
    }
    Ok((entries, files))
}

/// What `gpubake install` installs, and where: the step of a rendered Dockerfile that puts
/// the Python stack into its build stage.
pub struct InstallRequest<'a> {
    /// The closure (PEP 751), as `resolve -o` writes it.
    pub pylock: &'a Path,
    /// The wheel cache to take wheels from, and fill unless `offline`.
    pub wheels: PathBuf,
    /// The filesystem root to install under.
    pub root: &'a Path,
    /// The filesystem whose CPython the venv runs on.
    pub python_root: &'a Path,
    /// Take every wheel from the cache; download none.
    pub offline: bool,
}

/// What an install put where.
pub struct Installed {
    /// The closure's wheels.
    pub wheels: usize,
    /// The files written.
    pub files: usize,
    /// The venv, under the root.
    pub venv: PathBuf,
    /// The CPython it runs on, as the image names it.
    pub python: String,
}

/// Installs the closure into the filesystem under `req.root`, as [`build`] installs it into
/// layers: the same entries, the same tar stream, unpacked. Every wheel is checked by its
/// sha256 and every file against RECORD on the way.
pub fn install(req: &InstallRequest) -> Result<Installed> {
    let text = crate::closure::read_text(req.pylock)?;
    let closure = crate::closure::parse(req.pylock, &text)?;
    let want = closure.inputs().map(|i| i.python).ok_or_else(|| {
        Error::Closure(format!(
            "{}: no [tool.gpubake] table names the CPython it was resolved for",
            req.pylock.display()
        ))
    })?;
    let python = find_python_in(req.python_root, &want).map_err(|m| {
        Error::Environment(format!(
            "{}: {m}; the venv runs on the CPython of --root, or of --python-root when the \
             stack is installed apart from the image's filesystem",
            req.python_root.display()
        ))
    })?;
    let cache = WheelCache::open(req.wheels.clone())?;
    let fetch = FetchOptions {
        offline: req.offline,
        ..Default::default()
    };
    let epoch = super::build::source_date_epoch()?.unwrap_or(0);
    let scheme = Scheme::venv(VENV, &python.version);
    let paths = cache.fetch(&closure.wheels, &fetch)?;
    let fetched: HashMap<String, PathBuf> = closure
        .wheels
        .iter()
        .map(|w| w.sha256.clone())
        .zip(paths)
        .collect();
    let (mut entries, _) = install_all(&closure.wheels, &fetched, &scheme)?;
    entries.extend(venv_entries(&python));
    let files = entries.len();
    crate::image::layer::materialize(entries, epoch, req.root)?;
    Ok(Installed {
        wheels: closure.wheels.len(),
        files,
        venv: req.root.join(VENV.trim_start_matches('/')),
        python: python.path,
    })
}

/// The CPython of a live filesystem (a build stage), found as [`find_python`] finds it in
/// a base's layers.
fn find_python_in(root: &Path, want: &str) -> std::result::Result<Interpreter, String> {
    let mut paths = Vec::new();
    for dir in ["usr/local/bin", "usr/bin"] {
        if let Ok(list) = std::fs::read_dir(root.join(dir)) {
            for item in list.flatten() {
                paths.push(format!("{dir}/{}", item.file_name().to_string_lossy()));
            }
        }
    }
    find_python(&paths, want)
}

/// Records that `owner` installs `path`; two wheels may ship one path only with the same bytes
/// (many nvidia wheels ship one empty `nvidia/__init__.py`).
fn claim(owners: &mut Owners, path: String, owner: String, sha: Option<String>) -> Result<()> {
    match owners.get(&path) {
        Some((other, theirs)) if *theirs != sha && *other != owner => Err(Error::Wheel {
            wheel: owner,
            message: format!("/{path} is also installed by {other}, with different bytes"),
        }),
        Some(_) => Ok(()),
        None => {
            owners.insert(path, (owner, sha));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel(name: &str, size: u64) -> WheelRef {
        WheelRef {
            name: name.into(),
            version: "1".into(),
            url: format!("https://example.invalid/{name}-1-py3-none-any.whl"),
            size: Some(size),
            sha256: hex::encode(Sha256::digest(name)),
        }
    }

    #[test]
    fn the_base_python_is_found_or_named() {
        let paths = vec![
            "usr/bin/python3".to_string(),
            "usr/bin/python3.11".to_string(),
            "usr/bin/python3.11-config".to_string(),
        ];
        let found = find_python(&paths, "3.11").unwrap();
        assert_eq!(found.path, "/usr/bin/python3.11");
        let err = find_python(&paths, "3.12").unwrap_err();
        assert!(err.contains("CPython 3.11 (/usr/bin/python3.11)"), "{err}");
        assert!(err.contains("pins CPython 3.12"), "{err}");
        let err = find_python(&["bin/sh".to_string()], "3.12").unwrap_err();
        assert!(err.contains("no CPython"), "{err}");
    }

    #[test]
    fn big_wheels_get_their_own_layers_and_the_budget_holds() {
        let wheels = vec![
            wheel("torch", 900 << 20),
            wheel("nvidia-cudnn-cu12", 700 << 20),
            wheel("nvidia-nvtx-cu12", 90 << 10),
            wheel("nvidia-cuda-runtime-cu12", 1 << 20),
            wheel("sympy", 6 << 20),
            wheel("transformers", 12 << 20),
        ];
        let layers = plan(&wheels, &["transformers".to_string()], 60).unwrap();
        let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            ["torch", "nvidia-cudnn-cu12", "nvidia", "python", "extras"]
        );
        assert_eq!(layers[2].wheels.len(), 2);
        // With room for one big wheel only, the smaller one joins its group.
        let tight = plan(&wheels, &[], 5).unwrap();
        let names: Vec<&str> = tight.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["torch", "nvidia", "python"]);
        assert_eq!(tight[1].wheels.len(), 3);
        // At the floor every wheel goes into its group; below it nothing is planned.
        let floor = plan(&wheels, &[], MIN_STACK_LAYERS).unwrap();
        let names: Vec<&str> = floor.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["nvidia", "python"]);
        for budget in [0, 3] {
            let err = plan(&wheels, &[], budget).unwrap_err().to_string();
            assert!(err.contains("at least 4 layers"), "{err}");
        }
    }

    #[test]
    fn one_path_with_two_contents_is_refused() {
        let mut owners = BTreeMap::new();
        let same = Some("e3b0".to_string());
        claim(
            &mut owners,
            "a/__init__.py".into(),
            "x 1".into(),
            same.clone(),
        )
        .unwrap();
        claim(&mut owners, "a/__init__.py".into(), "y 1".into(), same).unwrap();
        let err = claim(
            &mut owners,
            "a/__init__.py".into(),
            "z 2".into(),
            Some("ff".into()),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("z 2") && err.contains("x 1"), "{err}");
    }
}
