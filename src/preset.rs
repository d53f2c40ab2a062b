//! Layered NCCL presets: files in `env-presets/` that set environment variables, each with a
//! reason, and may extend other presets. Merging keeps, for every variable, which preset set
//! it and which values it replaced, so a lock can say where each setting came from.
//!
//! A name is looked up in the preset directories (`--preset-dir`, `GPUBAKE_PRESET_PATH`,
//! `./env-presets`) and then in the presets built into the binary; a name with a `/` or a
//! `.yaml` ending is a path relative to the file that names it.

use crate::document::{Document, UniqueMap};
use crate::error::{Error, Location, Result};
use crate::recipe::check_env_entry;
use crate::version::{Constraint, Version};
use include_dir::{Dir, include_dir};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The presets shipped in `env-presets/`.
pub static BUILTIN_PRESETS: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/env-presets");

/// A preset file as written.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PresetFile {
    /// What the preset is for.
    pub description: String,
    /// Presets applied before this one.
    #[serde(default)]
    pub extends: Vec<String>,
    /// Versions the settings need.
    #[serde(default)]
    pub requires: Requires,
    /// A debugging overlay: production-risk warnings are expected and not reported for it alone.
    #[serde(default)]
    pub debug: bool,
    /// The variables, each with its reason.
    pub env: UniqueMap<Setting>,
}

/// Versions a preset needs.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Requires {
    /// The NCCL versions that read every variable the preset sets.
    #[serde(default)]
    pub nccl: Option<Constraint>,
}

/// One variable in a preset.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    /// The value, exactly as the process environment will hold it.
    pub value: String,
    /// Why this value, for people reading the lock or the image.
    pub reason: String,
    /// Lint rules whose warnings this setting accepts knowingly (`[production-risk]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
}

fn field_help(field: &str) -> Option<String> {
    let text = match field {
        "description" => "one line on what the preset is for",
        "extends" => "a list of preset names applied first",
        "requires" => "`{nccl: \">=2.24\"}`",
        "debug" => "true for debugging overlays",
        "env" => {
            "a mapping `NCCL_NAME: {value: \"...\", reason: \"...\", allow: [production-risk]}`"
        }
        _ => "the preset fields: description, extends, requires, debug, env",
    };
    Some(text.to_string())
}

/// A preset loaded from a file or from the binary.
pub struct Preset {
    /// The name it was asked for by (file stem for paths).
    pub name: String,
    /// Its source.
    pub doc: Document,
    /// Its parsed content.
    pub file: PresetFile,
}

impl Preset {
    /// Read from a file that hides a different built-in preset of the same name. A copy of
    /// the built-in one (the repository's own `env-presets/`, seen from its root) hides
    /// nothing and is not worth a warning.
    pub fn shadows_builtin(&self) -> bool {
        !self.doc.name().starts_with("builtin:")
            && BUILTIN_PRESETS
                .get_file(format!("{}.yaml", self.name))
                .is_some_and(|builtin| builtin.contents() != self.doc.text().as_bytes())
    }

    /// Parses and checks a document as a preset named `name`.
    pub fn parse(name: impl Into<String>, doc: Document) -> Result<Self> {
        let file: PresetFile = doc.parse("preset", field_help)?;
        for (var, setting) in &file.env.0 {
            check_env_entry(&doc, &["env", var], var, &setting.value)?;
            if let Some((i, code)) = setting
                .allow
                .iter()
                .enumerate()
                .find(|(_, c)| !crate::nccl::ALLOWABLE.contains(&c.as_str()))
            {
                return Err(doc.invalid(
                    &["env", var, "allow", &i.to_string()],
                    format!("`{code}` is not a lint warning that can be allowed"),
                    Some(crate::nccl::ALLOWABLE.join(", ")),
                ));
            }
            if setting.reason.trim().is_empty() {
                return Err(doc.invalid(
                    &["env", var, "reason"],
                    "the reason is empty",
                    Some("a sentence on why this value is right for the nodes it targets".into()),
                ));
            }
        }
        Ok(Preset {
            name: name.into(),
            doc,
            file,
        })
    }
}

/// Where presets are looked up.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    dirs: Vec<PathBuf>,
}

impl Catalog {
    /// Directories searched before the built-in presets, in order.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        Catalog { dirs }
    }

    /// The default search path: the given dirs, `GPUBAKE_PRESET_PATH`, then `./env-presets`.
    pub fn from_env(extra: &[PathBuf]) -> Self {
        let mut dirs = extra.to_vec();
        if let Some(path) = std::env::var_os("GPUBAKE_PRESET_PATH") {
            dirs.extend(std::env::split_paths(&path));
        }
        dirs.push(PathBuf::from("env-presets"));
        Catalog { dirs }
    }

    /// Where names are looked up, in order, for messages.
    pub fn searched(&self) -> Vec<String> {
        self.dirs
            .iter()
            .map(|d| d.display().to_string())
            .chain(std::iter::once("the built-in presets".to_string()))
            .collect()
    }

    /// Every preset name visible through the catalog, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = BUILTIN_PRESETS
            .files()
            .filter_map(|f| yaml_stem(f.path()))
            .collect();
        for dir in &self.dirs {
            if let Ok(entries) = std::fs::read_dir(dir) {
                names.extend(entries.filter_map(|e| yaml_stem(&e.ok()?.path())));
            }
        }
        names.sort();
        names.dedup();
        names
    }

    /// Every preset visible through the catalog, loaded as if referenced from `from`, by
    /// name; and apart, each preset whose file is broken, named with its error: one broken
    /// file does not hide the others.
    pub fn load_all(&self, from: &Location) -> (Vec<(String, Preset)>, Vec<String>) {
        let mut loaded = Vec::new();
        let mut broken = Vec::new();
        for name in self.names() {
            match self.load(&name, from, None) {
                Ok(p) => loaded.push((name, p)),
                Err(e) => broken.push(format!("{name}: {e}")),
            }
        }
        (loaded, broken)
    }

    /// Loads the preset `name`, referenced from `from` (for relative paths and messages).
    pub fn load(&self, name: &str, from: &Location, from_dir: Option<&Path>) -> Result<Preset> {
        if name.contains('/') || name.ends_with(".yaml") || name.ends_with(".yml") {
            let path = match from_dir {
                Some(dir) if Path::new(name).is_relative() => dir.join(name),
                _ => PathBuf::from(name),
            };
            let stem = yaml_stem(&path).unwrap_or_else(|| name.to_string());
            return Preset::parse(stem, Document::read(&path)?);
        }
        for dir in &self.dirs {
            for ext in ["yaml", "yml"] {
                let path = dir.join(format!("{name}.{ext}"));
                if path.is_file() {
                    return Preset::parse(name, Document::read(&path)?);
                }
            }
        }
        if let Some(text) = BUILTIN_PRESETS
            .get_file(format!("{name}.yaml"))
            .and_then(|f| f.contents_utf8())
        {
            return Preset::parse(
                name,
                Document::from_text(format!("builtin:env-presets/{name}.yaml"), text),
            );
        }
        Err(Error::UnknownPreset {
            name: name.to_string(),
            referenced_at: from.clone(),
            lookup: Box::new((self.names(), self.searched())),
        })
    }

    /// Loads `names` and everything they extend, in application order: each preset after the
    /// ones it extends, and every preset once.
    pub fn layers(
        &self,
        names: &[(String, Location)],
        from_dir: Option<&Path>,
    ) -> Result<Vec<Preset>> {
        let mut out = Vec::new();
        for (name, at) in names {
            self.visit(name, at, from_dir, &mut Vec::new(), &mut out)?;
        }
        Ok(out)
    }

    fn visit(
        &self,
        name: &str,
        at: &Location,
        from_dir: Option<&Path>,
        stack: &mut Vec<String>,
        out: &mut Vec<Preset>,
    ) -> Result<()> {
        if stack.iter().any(|s| s == name) {
            let mut chain = stack.clone();
            chain.push(name.to_string());
            return Err(Error::PresetCycle {
                at: at.clone(),
                chain,
            });
        }
        if out.iter().any(|p| p.name == name) {
            return Ok(());
        }
        let preset = self.load(name, at, from_dir)?;
        let dir = preset_dir(&preset);
        stack.push(name.to_string());
        for (i, parent) in preset.file.extends.iter().enumerate() {
            let at = preset.doc.locate(&["extends", &i.to_string()], false);
            self.visit(parent, &at, dir.as_deref().or(from_dir), stack, out)?;
        }
        stack.pop();
        out.push(preset);
        Ok(())
    }
}

fn preset_dir(preset: &Preset) -> Option<PathBuf> {
    let name = preset.doc.name();
    (!name.starts_with("builtin:")).then(|| Path::new(name).parent().map(Path::to_path_buf))?
}

fn yaml_stem(path: &Path) -> Option<String> {
    let ext = path.extension()?.to_str()?;
    (ext == "yaml" || ext == "yml").then(|| path.file_stem()?.to_str().map(String::from))?
}

/// Where a merged value came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Origin {
    /// `preset NAME` or `recipe`.
    pub by: String,
    /// The file and line.
    pub at: String,
}

/// A value that a later layer replaced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Replaced {
    /// The old value.
    pub value: String,
    /// Where it was set.
    pub by: String,
}

/// One merged variable with its provenance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergedVar {
    /// The final value.
    pub value: String,
    /// Who set it last.
    #[serde(flatten)]
    pub origin: Origin,
    /// Why, when the setter said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Earlier values this one replaced, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<Replaced>,
    /// Lint warnings the setter accepts knowingly (a preset's `allow:`), kept so that lint
    /// of the lock, the image's nccl.conf and certify give the answer lint of the recipe gives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
}

/// The merged environment of several layers, sorted by variable name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MergedEnv(pub IndexMap<String, MergedVar>);

impl MergedEnv {
    /// Sets `name`, recording what it replaces. The new value accepts no lint warnings: an
    /// allowance belongs to the value its setter wrote.
    pub fn set(&mut self, name: &str, value: &str, origin: Origin, reason: Option<String>) {
        let mut replaced = Vec::new();
        if let Some(old) = self.0.shift_remove(name) {
            replaced = old.replaced;
            if old.value != value || old.origin.by != origin.by {
                replaced.push(Replaced {
                    value: old.value,
                    by: old.origin.by,
                });
            }
        }
        self.0.insert(
            name.to_string(),
            MergedVar {
                value: value.to_string(),
                origin,
                reason,
                replaced,
                allow: Vec::new(),
            },
        );
        self.0.sort_keys();
    }

    /// Applies preset layers in order.
    pub fn from_layers(layers: &[Preset]) -> Self {
        let mut env = MergedEnv::default();
        for preset in layers {
            for (name, setting) in &preset.file.env.0 {
                // A preset from a directory given by path names no host directory in the lock.
                let at = preset.doc.locate(&["env", name], true).portable();
                env.set(
                    name,
                    &setting.value,
                    Origin {
                        by: format!("preset {}", preset.name),
                        at: at.to_string(),
                    },
                    Some(setting.reason.clone()),
                );
                if let Some(var) = env.0.get_mut(name) {
                    var.allow = setting.allow.clone();
                }
            }
        }
        env
    }

    /// The `NAME=value` lines of `/etc/nccl.conf`: the NCCL variables only. A variable whose
    /// preset allows lint warnings gets an [`allow_comment`] line above it, so that `gpubake
    /// lint /etc/nccl.conf` in the image drops the warnings the preset accepted.
    pub fn nccl_conf(&self) -> String {
        self.0
            .iter()
            .filter(|(name, _)| name.starts_with("NCCL_"))
            .map(|(name, var)| {
                let comment = if var.allow.is_empty() {
                    String::new()
                } else {
                    format!("{}\n", allow_comment(name, &var.allow))
                };
                format!("{comment}{name}={}\n", var.value)
            })
            .collect()
    }

    /// The lint warnings the setter of `name` accepts.
    pub fn allowed(&self, name: &str) -> &[String] {
        self.0.get(name).map_or(&[], |v| &v.allow)
    }
}

/// How nccl.conf records the lint warnings a setting accepts: `# gpubake allow NCCL_NET:
/// production-risk`. NCCL never reads it: the line starts with `#` (skipped since 2.26.2) and
/// has no `=` (skipped by every release), see [`crate::nccl::conf`].
pub const ALLOW_COMMENT: &str = "# gpubake allow ";

/// The comment line that records `allow` for `name`.
pub fn allow_comment(name: &str, allow: &[String]) -> String {
    format!("{ALLOW_COMMENT}{name}: {}", allow.join(", "))
}

/// The variable and the allowed lint rules of an [`allow_comment`] line, or None for any
/// other line.
pub fn parse_allow_comment(line: &str) -> Option<(&str, Vec<&str>)> {
    let rest = line.trim().strip_prefix(ALLOW_COMMENT)?;
    let (name, codes) = rest.split_once(':')?;
    let codes = codes.split(',').map(str::trim).filter(|c| !c.is_empty());
    Some((name.trim(), codes.collect()))
}

/// The NCCL constraint of every layer that states one, with the layer's name.
pub fn nccl_requirement(layers: &[Preset]) -> Vec<(Constraint, String)> {
    layers
        .iter()
        .filter_map(|p| {
            p.file
                .requires
                .nccl
                .clone()
                .map(|c| (c, format!("preset {}", p.name)))
        })
        .collect()
}

/// The lowest NCCL version the layers' requirements admit, if any names one.
pub fn nccl_floor(layers: &[Preset]) -> Option<Version> {
    nccl_requirement(layers)
        .iter()
        .filter_map(|(c, _)| c.floor())
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn at() -> Location {
        Location {
            file: "test".into(),
            line: None,
            column: None,
        }
    }

    fn write(dir: &Path, name: &str, text: &str) {
        fs::write(dir.join(format!("{name}.yaml")), text).unwrap();
    }

    #[test]
    fn later_layers_override_and_keep_provenance() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "a",
            "description: a\nenv:\n  NCCL_DEBUG: {value: WARN, reason: quiet}\n  NCCL_IB_TIMEOUT: {value: '20', reason: default}\n",
        );
        write(
            dir.path(),
            "b",
            "description: b\nextends: [a]\nenv:\n  NCCL_IB_TIMEOUT: {value: '22', reason: long links}\n",
        );
        let catalog = Catalog::new(vec![dir.path().to_path_buf()]);
        let layers = catalog.layers(&[("b".into(), at())], None).unwrap();
        assert_eq!(
            layers.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let env = MergedEnv::from_layers(&layers);
        let timeout = &env.0["NCCL_IB_TIMEOUT"];
        assert_eq!(timeout.value, "22");
        assert_eq!(timeout.origin.by, "preset b");
        assert!(
            timeout.origin.at.ends_with("b.yaml:4:3"),
            "{}",
            timeout.origin.at
        );
        assert_eq!(
            timeout.replaced,
            vec![Replaced {
                value: "20".into(),
                by: "preset a".into()
            }]
        );
        assert_eq!(env.0["NCCL_DEBUG"].origin.by, "preset a");
        assert_eq!(env.nccl_conf(), "NCCL_DEBUG=WARN\nNCCL_IB_TIMEOUT=22\n");
    }

    #[test]
    fn diamonds_apply_once_and_cycles_are_named() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "base", "description: x\nenv: {}\n");
        write(
            dir.path(),
            "l",
            "description: x\nextends: [base]\nenv: {}\n",
        );
        write(
            dir.path(),
            "r",
            "description: x\nextends: [base]\nenv: {}\n",
        );
        write(
            dir.path(),
            "top",
            "description: x\nextends: [l, r]\nenv: {}\n",
        );
        write(dir.path(), "x", "description: x\nextends: [y]\nenv: {}\n");
        write(dir.path(), "y", "description: x\nextends: [x]\nenv: {}\n");
        let catalog = Catalog::new(vec![dir.path().to_path_buf()]);
        let layers = catalog.layers(&[("top".into(), at())], None).unwrap();
        let names: Vec<_> = layers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["base", "l", "r", "top"]);
        let err = catalog
            .layers(&[("x".into(), at())], None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("x -> y -> x"), "{err}");
    }

    #[test]
    fn unknown_names_suggest_the_closest() {
        let catalog = Catalog::new(vec![]);
        let err = catalog
            .load("nvlnk", &at(), None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("did you mean `nvlink`"), "{err}");
    }

    #[test]
    fn a_setting_needs_a_reason() {
        let doc = Document::from_text(
            "p.yaml",
            "description: x\nenv:\n  NCCL_DEBUG: {value: WARN}\n",
        );
        let err = Preset::parse("p", doc).err().unwrap().to_string();
        assert!(err.contains("missing field `reason`"), "{err}");
    }

    #[test]
    fn every_builtin_preset_parses() {
        let catalog = Catalog::new(vec![]);
        for name in catalog.names() {
            catalog
                .layers(&[(name.clone(), at())], None)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(catalog.names().len() >= 6);
    }
}
