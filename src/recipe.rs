//! Recipes: what a team asks for (PyTorch, CUDA, Python, target GPUs, the fleet's driver floor,
//! NCCL presets), before anything is resolved. Unknown keys are errors.

use crate::document::{Document, UniqueMap};
use crate::error::Result;
use crate::version::Constraint;
use include_dir::{Dir, include_dir};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The example recipes shipped in `recipes/`, embedded so the binary runs anywhere.
pub static BUILTIN_RECIPES: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/recipes");

/// The recipe `gpubake resolve` uses when given none.
pub const DEFAULT_RECIPE: &str = "h100-pytorch2.9.yaml";

/// A recipe as written.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Image name.
    pub name: String,
    /// One line on what the image is for.
    #[serde(default)]
    pub description: Option<String>,
    /// Base image reference.
    pub base: String,
    /// Python version or constraint (`3.12`, `>=3.11`); a `t` suffix asks for the
    /// free-threaded build (`3.13t`).
    #[serde(default)]
    pub python: Option<String>,
    /// PyTorch version or constraint (`2.9`, `>=2.8,<2.11`); None for `pytorch: none`, a
    /// probe image: the gpubake probe on the base, without a Python stack or a lock.
    #[serde(with = "pytorch_field")]
    pub pytorch: Option<Constraint>,
    /// CUDA version or constraint (`12.8`, `>=12.6`).
    #[serde(default)]
    pub cuda: Option<Constraint>,
    /// NCCL constraint (`>=2.27`).
    #[serde(default)]
    pub nccl: Option<Constraint>,
    /// Target GPU models or sm archs.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// The fleet's driver floor (`>=550` or `550.54.15`).
    #[serde(default)]
    pub driver: Option<Constraint>,
    /// NCCL presets to layer, in order.
    #[serde(default)]
    pub presets: Vec<String>,
    /// Environment overrides, applied after the presets.
    #[serde(default)]
    pub env: UniqueMap<String>,
    /// Extra image labels.
    #[serde(default)]
    pub labels: UniqueMap<String>,
    /// Extra pip requirements (`transformers==4.57.1`), resolved together with PyTorch.
    #[serde(default)]
    pub pip: Vec<String>,
    /// The package index the closure is resolved from, instead of PyPI (or instead of the
    /// PyTorch index for builds that are not on PyPI): a PEP 503 simple index URL.
    #[serde(default)]
    pub index: Option<String>,
    /// Files and directories copied into the image by `gpubake build`.
    #[serde(default)]
    pub files: Vec<FileSpec>,
    /// The platforms to build for, as docker buildx writes them (`linux/amd64`,
    /// `linux/arm64`); `[linux/amd64]` when absent. More than one makes the image an index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub platforms: Vec<String>,
    /// OS packages installed on the base from its distribution's archive, by name or
    /// `name=version` (`numactl`, `openssh-client=1:9.2p1-2+deb12u7`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system: Vec<String>,
    /// The archives `system:` packages come from, instead of the base's own apt sources (a
    /// snapshot archive, say, for rebuilds that resolve the same way later).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apt: Vec<AptSource>,
    /// What the build does with a `system:` package's maintainer script that does something
    /// gpubake cannot make without running it, by package: `{skip: WHY}` builds without that
    /// package's scripts' effects, saying why. Without an entry such a package is refused.
    #[serde(default, skip_serializing_if = "UniqueMap::is_empty")]
    pub system_scripts: UniqueMap<ScriptPolicy>,
}

/// How the build treats one package's maintainer scripts.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptPolicy {
    /// Why the image does without what the scripts do; the build says it.
    pub skip: String,
}

/// An archive of Debian-style packages, as one line of apt's sources names it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AptSource {
    /// The archive's URL (`http://deb.debian.org/debian`).
    pub url: String,
    /// The suite (`bookworm`, `bookworm-updates`).
    pub suite: String,
    /// Its components; `[main]` when absent.
    #[serde(default = "main_component")]
    pub components: Vec<String>,
    /// The OpenPGP keyring its InRelease is signed with, relative to the recipe; the base's
    /// own keyrings when absent.
    #[serde(default)]
    pub keyring: Option<String>,
}

/// `pytorch:` as written: a constraint, or `none`. The field stays required, so that leaving
/// it out is still an error rather than a probe image nobody asked for.
mod pytorch_field {
    use crate::version::Constraint;
    use serde::{Deserialize, Deserializer, Serializer};

    /// The word that asks for no Python stack.
    pub const NONE: &str = "none";

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Constraint>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim() == NONE {
            return Ok(None);
        }
        text.parse().map(Some).map_err(serde::de::Error::custom)
    }

    pub fn serialize<S: Serializer>(ask: &Option<Constraint>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(ask.as_ref().map_or(NONE, Constraint::as_str))
    }
}

/// The fields that shape the Python stack, which a probe image (`pytorch: none`) has none of.
const STACK_FIELDS: [&str; 10] = [
    "python",
    "cuda",
    "nccl",
    "gpus",
    "driver",
    "pip",
    "index",
    "system",
    "apt",
    "system_scripts",
];

fn main_component() -> Vec<String> {
    vec!["main".into()]
}

impl Recipe {
    /// The packages whose maintainer scripts `system_scripts:` skips, with why.
    pub fn scripts_skipped(&self) -> BTreeMap<String, String> {
        self.system_scripts
            .0
            .iter()
            .map(|(p, policy)| (p.clone(), policy.skip.clone()))
            .collect()
    }

    /// True for `pytorch: none`: an image of the probe alone, with nothing to resolve.
    pub fn is_probe_image(&self) -> bool {
        self.pytorch.is_none()
    }

    /// Which of [`STACK_FIELDS`] the recipe sets.
    fn stack_fields(&self) -> Vec<&'static str> {
        let set = [
            self.python.is_some(),
            self.cuda.is_some(),
            self.nccl.is_some(),
            !self.gpus.is_empty(),
            self.driver.is_some(),
            !self.pip.is_empty(),
            self.index.is_some(),
            !self.system.is_empty(),
            !self.apt.is_empty(),
            !self.system_scripts.0.is_empty(),
        ];
        STACK_FIELDS
            .into_iter()
            .zip(set)
            .filter_map(|(f, on)| on.then_some(f))
            .collect()
    }

    /// The platforms to build for: those of `platforms:`, checked when the recipe was
    /// loaded, or linux/amd64.
    pub fn platforms(&self) -> Vec<crate::image::Platform> {
        if self.platforms.is_empty() {
            return vec![crate::image::Platform {
                os: "linux".into(),
                architecture: "amd64".into(),
                variant: None,
            }];
        }
        self.platforms
            .iter()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

/// A file or directory tree to copy into the image.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Source, relative to the recipe's directory.
    pub src: String,
    /// Absolute destination in the image.
    pub dest: String,
    /// Octal permission bits for regular files (`0644`); from the source's execute bit otherwise.
    #[serde(default)]
    pub mode: Option<String>,
    /// `src` may lie outside the recipe's directory. Without it such a source is refused, so
    /// that a recipe from elsewhere cannot copy the builder's own files (keys, credentials)
    /// into an image.
    #[serde(default)]
    pub allow_outside: bool,
}

impl FileSpec {
    /// The mode as a number.
    pub fn mode_bits(&self) -> Option<u32> {
        self.mode
            .as_ref()
            .and_then(|m| u32::from_str_radix(m.trim_start_matches("0o"), 8).ok())
    }
}

/// What each field allows, for error messages.
pub fn field_help(field: &str) -> Option<String> {
    let text = match field {
        "name" => {
            "an image name such as `llm-train`: a letter or digit, then letters, digits, `.`, \
             `_` and `-`, at most 128 characters"
        }
        "description" => "one line of text",
        "base" => "a base image reference such as `nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04`",
        "python" => "a Python version such as `3.12`, `3.13t`, or a constraint such as `>=3.11`",
        "pytorch" => {
            "a PyTorch version such as `2.9` or `2.9.1`, a constraint such as `>=2.8,<2.11`, or \
             `none` for an image of the gpubake probe alone"
        }
        "cuda" => "a CUDA version such as `12.8`, or a constraint such as `>=12.6`",
        "nccl" => "an NCCL constraint such as `>=2.27`",
        "gpus" => "a list of GPU models or sm archs, e.g. `[h100, h200]` or `[sm_90]`",
        "driver" => "the fleet's oldest driver, e.g. `>=550` or `570.86.10`",
        "presets" => "a list of preset names from env-presets/ or paths, e.g. `[base, nvlink]`",
        "env" => "a mapping of environment variables to string values",
        "labels" => "a mapping of label keys to string values",
        "pip" => "a list of pip requirements such as `transformers==4.57.1`",
        "index" => "a package index URL such as `https://download.pytorch.org/whl/cu126`",
        "platforms" => {
            "a list of platforms such as `[linux/amd64, linux/arm64]`; gpubake builds for \
             linux/amd64 and linux/arm64"
        }
        "system" => {
            "a list of Debian or Ubuntu package names, each optionally `=VERSION`, such as \
             `[numactl, openssh-client, rdma-core]`"
        }
        "system_scripts" => {
            "a mapping of `system:` packages to `{skip: \"why the image does without their \
             maintainer scripts\"}`, e.g. `{udev: {skip: \"no device database in a container\"}}`"
        }
        "apt" => {
            "a list of `{url: http://deb.debian.org/debian, suite: bookworm, components: [main], \
             keyring: keys/debian.gpg}`"
        }
        "files" => {
            "a list of `{src: ./train, dest: /workspace/train, mode: \"0755\"}`; src inside the \
             recipe's directory, unless the entry says `allow_outside: true`"
        }
        _ => {
            "the recipe fields: name, description, base, python, pytorch, cuda, nccl, gpus, \
             driver, presets, env, labels, pip, index, files, platforms, system, \
             system_scripts, apt"
        }
    };
    Some(text.to_string())
}

/// A recipe with the document it came from, so later stages can point into it.
pub struct LoadedRecipe {
    /// The parsed recipe.
    pub recipe: Recipe,
    /// Its source.
    pub doc: Document,
    /// `files:` sources outside the recipe's directory are allowed for every entry
    /// (`--allow-files-outside`), not only for those that say `allow_outside: true`.
    pub allow_files_outside: bool,
}

impl LoadedRecipe {
    /// Reads and checks a recipe file.
    pub fn read(path: &Path) -> Result<Self> {
        Self::parse(Document::read(path)?)
    }

    /// The recipe that ships as the default main job.
    pub fn builtin_default() -> Self {
        Self::builtin(DEFAULT_RECIPE).expect("the default recipe is embedded and checked by tests")
    }

    /// An embedded recipe by file name.
    pub fn builtin(file: &str) -> Option<Self> {
        let text = BUILTIN_RECIPES.get_file(file)?.contents_utf8()?;
        Self::parse(Document::from_text(format!("recipes/{file}"), text)).ok()
    }

    /// The recipe's `files:` with their sources resolved against the recipe's directory; a
    /// missing source, or one outside that directory (through `..`, an absolute path or a
    /// symlink) that is not allowed, is an error naming its field.
    pub fn file_sources(&self) -> Result<Vec<(std::path::PathBuf, &FileSpec)>> {
        let base_dir = match Path::new(self.doc.name()).parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut out = Vec::new();
        for (i, f) in self.recipe.files.iter().enumerate() {
            let field = ["files", &i.to_string(), "src"];
            let src = base_dir.join(&f.src);
            if !src.exists() {
                return Err(self.doc.invalid(
                    &field,
                    // As written beside the recipe's folder, without `./` doubled.
                    format!(
                        "{} does not exist",
                        src.components().collect::<std::path::PathBuf>().display()
                    ),
                    Some("a file or directory relative to the recipe".into()),
                ));
            }
            if !(f.allow_outside || self.allow_files_outside) {
                // Symlinks are resolved: the content read is what counts, not the spelling.
                let real = |p: &Path| {
                    p.canonicalize()
                        .map_err(|e| crate::error::Error::reading(p, e))
                };
                let (dir, real_src) = (real(base_dir)?, real(&src)?);
                if !real_src.starts_with(&dir) {
                    return Err(self.doc.invalid(
                        &field,
                        format!(
                            "`{}` is {}, outside the recipe's directory {}",
                            f.src,
                            real_src.display(),
                            dir.display()
                        ),
                        Some(
                            "move it beside the recipe, or allow it: `allow_outside: true` on \
                             this entry, or --allow-files-outside"
                                .into(),
                        ),
                    ));
                }
            }
            if let Err(why) = check_tree(&src, &f.dest) {
                return Err(self.doc.invalid(
                    &field,
                    format!("`{}`: {why}", f.src),
                    Some(
                        "files and directories whose symlinks stay inside them, copied to paths \
                         gpubake does not write"
                            .into(),
                    ),
                ));
            }
            out.push((src, f));
        }
        Ok(out)
    }

    /// Parses and checks a document as a recipe.
    pub fn parse(doc: Document) -> Result<Self> {
        let recipe: Recipe = doc.parse("recipe", field_help)?;
        check(&recipe, &doc)?;
        Ok(LoadedRecipe {
            recipe,
            doc,
            allow_files_outside: false,
        })
    }
}

/// Checks what the types alone cannot: names, env variable names and values.
fn check(recipe: &Recipe, doc: &Document) -> Result<()> {
    if recipe.name.trim().is_empty() {
        return Err(doc.invalid(&["name"], "the name is empty", field_help("name")));
    }
    if let Err(why) = check_name(&recipe.name) {
        return Err(doc.invalid(
            &["name"],
            format!("`{}` is not an image name: {why}", recipe.name),
            field_help("name"),
        ));
    }
    if recipe.base.trim().is_empty() || recipe.base.contains(char::is_whitespace) {
        return Err(doc.invalid(
            &["base"],
            format!("`{}` is not an image reference", recipe.base),
            field_help("base"),
        ));
    }
    check_probe(recipe, doc)?;
    if let Some(python) = &recipe.python {
        python
            .trim_end_matches('t')
            .parse::<Constraint>()
            .map_err(|e| doc.invalid(&["python"], e, field_help("python")))?;
    }
    for (name, value) in &recipe.env.0 {
        check_env_entry(doc, &["env", name], name, value)?;
    }
    for (i, f) in recipe.files.iter().enumerate() {
        let at = |field: &str| vec!["files".to_string(), i.to_string(), field.to_string()];
        let dest_ok = f.dest.starts_with('/')
            && !f.dest.split('/').any(|c| c == ".." || c == ".")
            && f.dest.trim_end_matches('/').len() > 1;
        if !dest_ok {
            let path = at("dest");
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            return Err(doc.invalid(
                &path,
                format!("`{}` is not an absolute path inside the image", f.dest),
                Some("an absolute path without `.` or `..`, such as /workspace/train".into()),
            ));
        }
        if f.mode.is_some() && f.mode_bits().is_none_or(|m| m > 0o7777) {
            let path = at("mode");
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            return Err(doc.invalid(
                &path,
                "not an octal mode",
                Some("a mode such as \"0644\" or \"0755\"".into()),
            ));
        }
        if f.mode_bits().is_some_and(|m| m & 0o002 != 0) {
            let path = at("mode");
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            return Err(doc.invalid(
                &path,
                format!(
                    "mode {} makes the file world-writable: any user in the container could \
                     change it",
                    f.mode.as_deref().unwrap_or_default()
                ),
                Some("a mode without write for others, such as \"0644\" or \"0755\"".into()),
            ));
        }
    }
    for (i, ask) in recipe.system.iter().enumerate() {
        if let Err(why) = ask.parse::<crate::debian::Ask>() {
            return Err(doc.invalid(
                &["system", &i.to_string()],
                why.to_string(),
                field_help("system"),
            ));
        }
    }
    for (i, source) in recipe.apt.iter().enumerate() {
        let i = i.to_string();
        if !(source.url.starts_with("http://") || source.url.starts_with("https://")) {
            return Err(doc.invalid(
                &["apt", &i, "url"],
                format!("`{}` is not an http:// or https:// URL", source.url),
                field_help("apt"),
            ));
        }
        if source.suite.is_empty() || source.suite.contains(char::is_whitespace) {
            return Err(doc.invalid(
                &["apt", &i, "suite"],
                format!("`{}` is not a suite name", source.suite),
                field_help("apt"),
            ));
        }
    }
    check_pip(recipe, doc)?;
    let mut seen: Vec<crate::image::Platform> = Vec::new();
    for (i, text) in recipe.platforms.iter().enumerate() {
        let at = ["platforms", &i.to_string()];
        let platform: crate::image::Platform = text.parse().map_err(|_| {
            doc.invalid(
                &at,
                format!("`{text}` is not a platform written OS/ARCH[/VARIANT]"),
                field_help("platforms"),
            )
        })?;
        platform
            .buildable()
            .map_err(|m| doc.invalid(&at, m, field_help("platforms")))?;
        if let Some(first) = seen.iter().find(|p| p.same_as(&platform)) {
            return Err(doc.invalid(
                &at,
                format!("`{text}` is the same platform as {first}, given before"),
                Some("each platform once".into()),
            ));
        }
        seen.push(platform);
    }
    if let Some(index) = &recipe.index
        && !(index.starts_with("https://")
            || index.starts_with("http://")
            || index.starts_with("file://"))
    {
        return Err(doc.invalid(
            &["index"],
            format!("`{index}` is not an index URL"),
            field_help("index"),
        ));
    }
    Ok(())
}

/// A probe recipe (`pytorch: none`) sets none of the fields that shape a Python stack.
fn check_probe(recipe: &Recipe, doc: &Document) -> Result<()> {
    if !recipe.is_probe_image() {
        return Ok(());
    }
    let Some(field) = recipe.stack_fields().first().copied() else {
        return Ok(());
    };
    // At the key: the field is what is wrong, whatever its value.
    Err(crate::error::Error::invalid(
        doc.locate(&[field], true),
        Some(field.to_string()),
        format!(
            "`{field}:` shapes the Python stack, and `pytorch: none` builds an image of the \
             gpubake probe alone, without one"
        ),
        Some(format!(
            "drop `{field}:`, or ask for a PyTorch release in `pytorch:`"
        )),
    ))
}

/// Each `pip:` requirement is one plain requirement, and none asks for torch, which
/// `pytorch:` chooses.
fn check_pip(recipe: &Recipe, doc: &Document) -> Result<()> {
    for (i, req) in recipe.pip.iter().enumerate() {
        if req.trim().is_empty() || req.contains(['\n', '\'', '"', '`', '$', ';', '&', '|']) {
            return Err(doc.invalid(
                &["pip", &i.to_string()],
                format!("`{req}` is not a plain pip requirement"),
                field_help("pip"),
            ));
        }
        let name = req
            .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
            .next()
            .unwrap_or_default();
        if crate::names::normalize(name) == "torch" {
            return Err(doc.invalid(
                &["pip", &i.to_string()],
                format!(
                    "`{req}` asks for torch beside `pytorch: {}`, which chooses the torch build \
                     and everything pinned with it",
                    recipe
                        .pytorch
                        .as_ref()
                        .map_or(pytorch_field::NONE, Constraint::as_str)
                ),
                Some("drop it from `pip:` and ask in `pytorch:` (`pytorch: \"==2.8.0\"`)".into()),
            ));
        }
    }
    Ok(())
}

/// The paths gpubake writes into every image, which a recipe's `files:` may not replace:
/// the venv, the lock and preset, NCCL's config file, the probe.
const OWNED_PATHS: [&str; 4] = [
    crate::names::VENV,
    "/etc/gpubake",
    "/etc/nccl.conf",
    crate::names::PROBE_PATH_IN_IMAGE,
];

/// A `files:` entry as it lands in the image: no path of it replaces one gpubake writes, and
/// no symlink in it points outside it (an absolute target names a path of the build host, which
/// in the image is another file or none; a relative one that climbs out reaches the same).
fn check_tree(src: &Path, dest: &str) -> std::result::Result<(), String> {
    let dest = format!("/{}", dest.trim_matches('/'));
    let owned = |path: &str| {
        OWNED_PATHS
            .iter()
            .find(|o| path == **o || path.starts_with(&format!("{o}/")))
    };
    if let Some(o) = owned(&dest) {
        return Err(format!(
            "its destination {dest} would replace {o}, which gpubake writes"
        ));
    }
    for item in walkdir::WalkDir::new(src).follow_links(false).min_depth(1) {
        let item = item.map_err(|e| e.to_string())?;
        let rel = item.path().strip_prefix(src).unwrap_or(item.path());
        let at = format!("{dest}/{}", rel.display());
        if let Some(o) = owned(&at) {
            return Err(format!(
                "{} would land at {at}, replacing {o}, which gpubake writes",
                item.path().display()
            ));
        }
        if !item.file_type().is_symlink() {
            continue;
        }
        let target = std::fs::read_link(item.path()).map_err(|e| e.to_string())?;
        let escapes = target.is_absolute() || {
            // Climb from the link's directory inside the tree; below its root is outside.
            let mut depth = rel.components().count() as i64 - 1;
            target.components().any(|c| {
                match c {
                    std::path::Component::ParentDir => depth -= 1,
                    std::path::Component::Normal(_) => depth += 1,
                    _ => {}
                }
                depth < 0
            })
        };
        if escapes {
            return Err(format!(
                "the symlink {} points at {}, outside the directory: in the image it would \
                 not be that file",
                item.path().display(),
                target.display()
            ));
        }
    }
    Ok(())
}

/// The longest recipe name: a file name (`pylock.NAME.toml`) and an image name must hold it.
const NAME_MAX: usize = 128;

/// A recipe's name names files beside the lock (`pylock.NAME.toml`) and the image, so it is
/// one path component that needs no quoting: a letter or digit, then letters, digits, `.`,
/// `_` and `-`, at most [`NAME_MAX`] bytes.
fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.len() > NAME_MAX {
        return Err(format!("{} bytes, more than {NAME_MAX}", name.len()));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("it must start with a letter or a digit".into());
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => Err(format!("{c:?} is not allowed")),
        None => Ok(()),
    }
}

/// The variables gpubake sets in every image, with why a recipe or preset may not: both
/// build paths would have to pick a winner, and either pick breaks the image or its lock.
pub fn owned_env(name: &str) -> Option<&'static str> {
    Some(match name {
        "PATH" => {
            "the image's PATH is the venv's bin followed by the base's PATH, so `python3` is \
             the venv's; put tools in /usr/local/bin instead"
        }
        "VIRTUAL_ENV" => "it names the venv gpubake installs, /opt/gpubake/venv",
        "NVIDIA_VISIBLE_DEVICES" | "NVIDIA_DRIVER_CAPABILITIES" | "NVIDIA_REQUIRE_CUDA" => {
            "it is derived from the lock (its `nvidia:` section) for nvidia-container-toolkit; \
             choose devices at run time (`docker run --gpus`, `-e`)"
        }
        "LD_LIBRARY_PATH" => {
            "torch loads the CUDA libraries of the venv's nvidia-* wheels through its RPATH, \
             and LD_LIBRARY_PATH is searched before it, so other copies would be bound; the \
             driver's libraries come from nvidia-container-toolkit"
        }
        _ => return None,
    })
}

/// An environment variable's name must be a shell identifier and its value one line, since
/// it goes into `ENV` and `/etc/nccl.conf`.
pub fn check_env_entry(doc: &Document, path: &[&str], name: &str, value: &str) -> Result<()> {
    let valid_name = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_name {
        return Err(doc.invalid(
            path,
            format!("`{name}` is not an environment variable name"),
            Some("letters, digits and `_`, not starting with a digit".into()),
        ));
    }
    if let Some(why) = owned_env(name) {
        // At the key: the name is what is wrong, whatever the value.
        return Err(crate::error::Error::invalid(
            doc.locate(path, true),
            Some(crate::document::field_path(path)),
            format!("`{name}` is set by gpubake, not by recipes or presets: {why}"),
            Some(format!("drop `{name}` from `env:`")),
        ));
    }
    if value.contains(['\n', '\r', '\0']) || value.len() > 1023 {
        return Err(doc.invalid(
            path,
            "the value must be one line of at most 1023 bytes",
            Some("NCCL reads /etc/nccl.conf one `NAME=value` line at a time".into()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_recipe_parses() {
        for file in BUILTIN_RECIPES.files() {
            let name = file.path().file_name().unwrap().to_str().unwrap();
            assert!(
                LoadedRecipe::builtin(name).is_some(),
                "{name} does not parse"
            );
        }
        let default = LoadedRecipe::builtin_default();
        assert_eq!(default.recipe.pytorch.unwrap().as_str(), "2.9");
    }

    #[test]
    fn platforms_are_checked_where_they_are_written() {
        let parse = |extra: &str| {
            let doc = Document::from_text(
                "r.yaml",
                format!("name: a\nbase: x\npytorch: '2.9'\n{extra}"),
            );
            LoadedRecipe::parse(doc).map(|l| l.recipe.platforms())
        };
        let default = parse("").unwrap();
        assert_eq!(default.len(), 1);
        assert_eq!(default[0].to_string(), "linux/amd64");
        let two = parse("platforms: [linux/amd64, linux/arm64/v8]\n").unwrap();
        assert_eq!(two[1].to_string(), "linux/arm64/v8");
        let err = parse("platforms:\n  - linux/amd64\n  - linux/riscv64\n")
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("r.yaml:6:5: field `platforms[1]`"), "{err}");
        assert!(err.contains("linux/amd64 and linux/arm64"), "{err}");
        let err = parse("platforms: [linux/arm64, linux/arm64/v8]\n")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("same platform as linux/arm64"), "{err}");
        let err = parse("platforms: [arm64]\n").err().unwrap().to_string();
        assert!(err.contains("`arm64` is not a platform"), "{err}");
    }

    #[test]
    fn names_that_cannot_name_a_file_are_refused_with_the_rule() {
        let long = "a".repeat(300);
        for (name, why) in [
            ("sub/x", "'/' is not allowed"),
            ("..", "must start with a letter or a digit"),
            ("'my image'", "' ' is not allowed"),
            ("'x$(id)'", "'$' is not allowed"),
            ("--", "must start with a letter or a digit"),
            (long.as_str(), "300 bytes, more than 128"),
        ] {
            let err = LoadedRecipe::parse(Document::from_text(
                "r.yaml",
                format!("base: x\nname: {name}\npytorch: '2.9'\n"),
            ))
            .err()
            .unwrap()
            .to_string();
            assert!(err.contains("r.yaml:2:7"), "{err}");
            assert!(err.contains(why) && err.contains("at most 128"), "{err}");
        }
        for name in ["llm-train-h100", "Train_2.9", "a"] {
            assert!(
                LoadedRecipe::parse(Document::from_text(
                    "r.yaml",
                    format!("name: {name}\nbase: x\npytorch: '2.9'\n"),
                ))
                .is_ok(),
                "{name}"
            );
        }
    }

    #[test]
    fn torch_in_pip_is_refused_beside_pytorch() {
        for req in ["torch==2.8.0", "Torch>=2", "torch[opt]"] {
            let err = LoadedRecipe::parse(Document::from_text(
                "r.yaml",
                format!("name: a\nbase: x\npytorch: '2.9'\npip: [six, '{req}']\n"),
            ))
            .err()
            .unwrap()
            .to_string();
            assert!(
                err.contains("r.yaml:4:") && err.contains("asks for torch"),
                "{err}"
            );
        }
        assert!(
            LoadedRecipe::parse(Document::from_text(
                "r.yaml",
                "name: a\nbase: x\npytorch: '2.9'\npip: [torchvision==0.24.1, torch-optimizer]\n",
            ))
            .is_ok()
        );
    }

    #[test]
    fn variables_gpubake_sets_are_refused_where_written() {
        for (key, value) in [
            ("PATH", "/usr/bin"),
            ("NVIDIA_VISIBLE_DEVICES", "\"0\""),
            ("VIRTUAL_ENV", "/x"),
            ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64"),
        ] {
            let err = LoadedRecipe::parse(Document::from_text(
                "r.yaml",
                format!("name: a\nbase: x\npytorch: '2.9'\nenv:\n  OMP_NUM_THREADS: '8'\n  {key}: {value}\n"),
            ))
            .err()
            .unwrap()
            .to_string();
            assert!(err.contains("r.yaml:6:"), "{err}");
            assert!(err.contains(&format!("`{key}` is set by gpubake")), "{err}");
        }
    }

    #[test]
    fn pytorch_none_is_a_probe_image_that_takes_no_stack_fields() {
        let parse = |text: &str| LoadedRecipe::parse(Document::from_text("r.yaml", text));
        let probe = parse("name: p\nbase: x\npytorch: none\npresets: [base]\n").unwrap();
        assert!(probe.recipe.is_probe_image());
        assert!(!LoadedRecipe::builtin_default().recipe.is_probe_image());
        // Leaving `pytorch:` out is still an error, not a probe image.
        let err = parse("name: p\nbase: x\n").err().unwrap().to_string();
        assert!(err.contains("pytorch"), "{err}");
        for (line, field) in [
            ("python: '3.12'", "python"),
            ("cuda: '12.8'", "cuda"),
            ("gpus: [h100]", "gpus"),
            ("pip: [six]", "pip"),
            ("system: [numactl]", "system"),
        ] {
            let err = parse(&format!("name: p\nbase: x\npytorch: none\n{line}\n"))
                .err()
                .unwrap()
                .to_string();
            assert!(err.starts_with("r.yaml:4:1: field `"), "{err}");
            assert!(
                err.contains(&format!("`{field}:` shapes the Python stack")),
                "{err}"
            );
        }
    }

    #[test]
    fn bad_env_names_are_located() {
        let doc = Document::from_text(
            "r.yaml",
            "name: a\nbase: x\npytorch: '2.9'\nenv:\n  9BAD: x\n",
        );
        let err = LoadedRecipe::parse(doc).err().unwrap().to_string();
        assert!(err.starts_with("r.yaml:5:"), "{err}");
        assert!(err.contains("9BAD"), "{err}");
    }
}
