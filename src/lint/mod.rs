//! The NCCL linter: checks every `NCCL_*` setting of recipes, presets and `nccl.conf` files
//! against NCCL's parameter table and the NCCL version the image pins.
//!
//! It reports unknown names (with a suggestion), values NCCL rejects, clamps or misparses,
//! variables the pinned NCCL does not read yet or no longer reads, and settings that are risky
//! in production. Errors fail the lint; warnings fail it only with `--strict`.

mod conf;
mod links;
pub mod value;

use crate::compat::Compat;
use crate::document::Document;
use crate::error::{Error, Location};
use crate::nccl::params::{Kind, Param, ParamTable, torch_name};
use crate::nccl::suggest::closest;
use crate::nccl::value::{PATH_LEVEL_VARS, PathLevel, path_level, strtoll};
use crate::preset::{Catalog, Preset, nccl_floor};
use crate::recipe::LoadedRecipe;
use crate::resolve::{self, Options};
use crate::verdict::{Status, Verdict};
use crate::version::Version;
use serde::Serialize;
use std::fmt;
use std::path::Path;

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Fails the lint.
    Error,
    /// Fails the lint only with `--strict`.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// What is wrong with one setting, before it is placed in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    /// How bad.
    pub severity: Severity,
    /// A stable short name for the rule (`unknown-name`, `out-of-range`).
    pub code: &'static str,
    /// What is wrong and what NCCL will do.
    pub message: String,
    /// What to write instead.
    pub help: Option<String>,
}

/// An issue placed in a file.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// How bad.
    pub severity: Severity,
    /// The rule.
    pub code: &'static str,
    /// Where.
    #[serde(flatten)]
    pub at: Location,
    /// The variable concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub var: Option<String>,
    /// The recipe that pulled this preset setting in, when the finding sits in a preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// What is wrong.
    pub message: String,
    /// What to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}[{}]: {}",
            self.at, self.severity, self.code, self.message
        )?;
        if let Some(via) = &self.via {
            write!(f, " (merged into {via})")?;
        }
        if let Some(help) = &self.help {
            write!(f, "\n  help: {help}")?;
        }
        Ok(())
    }
}

/// What a setting is checked against.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The NCCL version that will read it, when known.
    pub nccl: Option<Version>,
    /// Where that version comes from, for messages ("pinned by the lock").
    pub nccl_from: String,
    /// A debugging overlay: production risks are intended.
    pub debug: bool,
}

/// Checks one variable. Names outside `NCCL_*` are not NCCL's and pass unchecked.
///
/// ```
/// use gpubake::lint::{check_var, Context, Severity};
/// let issues = check_var("NCCL_NTHREADS", "1024", &Context::default());
/// assert_eq!(issues[0].code, "out-of-range");
/// assert_eq!(issues[0].severity, Severity::Error);
/// assert!(check_var("OMP_NUM_THREADS", "anything", &Context::default()).is_empty());
/// ```
pub fn check_var(name: &str, value: &str, ctx: &Context) -> Vec<Issue> {
    let table = ParamTable::embedded();
    if !name.to_ascii_uppercase().starts_with("NCCL_") {
        return Vec::new();
    }
    let mut out = Vec::new();
    let Some(p) = table.get(name) else {
        out.push(unknown_name(table, name, ctx));
        return out;
    };
    if let Some(v) = &ctx.nccl
        && p.since > *v
    {
        out.push(Issue {
            severity: Severity::Warning,
            code: "too-new",
            message: format!(
                "{name} is read from NCCL {} on; NCCL {v} ({}) ignores it",
                p.since, ctx.nccl_from
            ),
            help: Some(format!(
                "require NCCL >= {} (`requires: {{nccl: \">={}\"}}`) or drop it",
                p.since, p.since
            )),
        });
    }
    if let Some(dep) = &p.deprecated {
        out.push(Issue {
            severity: Severity::Warning,
            code: "deprecated",
            message: format!("{name} is deprecated since NCCL {}", dep.since),
            help: dep.replacement.as_ref().map(|r| format!("use {r}")),
        });
    }
    if p.unused {
        out.push(Issue {
            severity: Severity::Warning,
            code: "no-effect",
            message: format!(
                "NCCL {} defines {name} but never reads it: it has no effect",
                table.analyzed
            ),
            help: Some("drop it".into()),
        });
    }
    if value.is_empty() {
        out.push(Issue {
            severity: Severity::Warning,
            code: "empty",
            message: format!("{name} is empty: NCCL treats it as unset"),
            help: Some("give a value or drop the variable".into()),
        });
        return out;
    }
    if value.trim() != value && !matches!(p.kind, Kind::String | Kind::Path) {
        out.push(Issue {
            severity: Severity::Warning,
            code: "whitespace",
            message: format!("{name}=`{value}` has surrounding spaces, which NCCL keeps"),
            help: Some(format!("write `{}`", value.trim())),
        });
    }
    out.extend(match p.kind {
        Kind::Bool | Kind::Int | Kind::Size => value::check_integer(p, value),
        Kind::Enum if PATH_LEVEL_VARS.contains(&p.name.as_str()) => {
            value::check_path_level(p, value)
        }
        Kind::Enum => value::check_enum(p, value),
        Kind::List if p.prefix_match => value::check_prefix_list(p, value),
        Kind::List => value::check_list(p, value, ctx.nccl.as_ref()),
        Kind::Path if value.starts_with('~') => vec![Issue {
            severity: Severity::Warning,
            code: "tilde",
            message: format!("{name}: NCCL does not expand `~` in paths"),
            help: Some("write the absolute path".into()),
        }],
        Kind::String if p.name == "NCCL_NET" => value::check_net(p, value),
        Kind::String | Kind::Path => Vec::new(),
    });
    if let Some(risk) = &p.risk
        && !ctx.debug
        && is_risky(p, value)
    {
        out.push(Issue {
            severity: Severity::Warning,
            code: "production-risk",
            message: format!("{name}={value}: {risk}"),
            help: Some(
                "drop it unless these nodes need it; a preset that means it can say so with \
                 `allow: [production-risk]`"
                    .into(),
            ),
        });
    }
    out
}

fn is_risky(p: &Param, value: &str) -> bool {
    // Excluding interfaces or HCAs (`^docker,lo`) is the safe way to write those lists.
    if p.kind == Kind::List && p.values.is_empty() && value.starts_with('^') {
        return false;
    }
    // A leading `=` makes NCCL match the names exactly, which is what the prefix risk is about.
    if p.prefix_match && value.trim_start_matches('^').starts_with('=') {
        return false;
    }
    // Writing down NCCL's own default changes nothing.
    let number = strtoll(value);
    if number.digits && number.rest.is_empty() && p.default == Some(number.value) {
        return false;
    }
    // Path levels are risky by the level a value stands for, whether named or numbered.
    let value = match path_level(value) {
        PathLevel::Number {
            level: Some(level), ..
        } if PATH_LEVEL_VARS.contains(&p.name.as_str()) => level,
        _ => value,
    };
    p.risk_when.is_empty()
        || p.risk_when.iter().any(|w| {
            if p.case_sensitive {
                w == value
            } else {
                w.eq_ignore_ascii_case(value.trim())
            }
        })
}

fn unknown_name(table: &ParamTable, name: &str, ctx: &Context) -> Issue {
    let upper = name.to_ascii_uppercase();
    if upper != name && table.get(&upper).is_some() {
        return Issue {
            severity: Severity::Error,
            code: "unknown-name",
            message: format!("NCCL reads upper-case names only: `{name}` is ignored"),
            help: Some(format!("write {upper}")),
        };
    }
    if let Some(r) = table.removed(name) {
        let still_read = ctx.nccl.as_ref().is_some_and(|v| *v <= r.last);
        let help = r.replacement.as_ref().map(|u| format!("use {u}"));
        return Issue {
            severity: if still_read {
                Severity::Warning
            } else {
                Severity::Error
            },
            code: "removed",
            message: if still_read {
                format!("{name} is read only up to NCCL {}: {}", r.last, r.note)
            } else {
                format!("{name} was removed after NCCL {}: {}", r.last, r.note)
            },
            help,
        };
    }
    // PyTorch's old names look like NCCL's own; point at the name PyTorch wants now.
    if let Some(new) = torch_name(name) {
        return Issue {
            severity: Severity::Warning,
            code: "torch-name",
            message: format!(
                "NCCL does not read {name}; PyTorch does, as the deprecated old name of {new}"
            ),
            help: Some(format!("write {new}")),
        };
    }
    let suggestion = closest(name, table.all_names());
    Issue {
        severity: Severity::Error,
        code: "unknown-name",
        message: match suggestion {
            Some(s) => format!("NCCL does not read {name} (did you mean {s}?)"),
            None => format!("NCCL does not read {name}"),
        },
        help: suggestion.map(|s| format!("write {s}")),
    }
}

/// Everything found in one file.
#[derive(Debug, Serialize)]
pub struct FileReport {
    /// The file.
    pub file: String,
    /// recipe, preset or nccl.conf.
    pub kind: &'static str,
    /// The NCCL version the file was checked against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
    /// The findings, in file order.
    pub findings: Vec<Finding>,
    /// The file could not be read or parsed.
    #[serde(skip)]
    pub unreadable: bool,
}

/// Options of a lint run.
pub struct LintOptions {
    /// Check against this NCCL version instead of the one the file implies.
    pub nccl: Option<Version>,
    /// Resolve options (preset search path, driver floor) for recipes.
    pub resolve: Options,
}

/// Lints one file, recognising recipes, presets and `nccl.conf` files.
pub fn lint_file(path: &Path, opts: &LintOptions) -> FileReport {
    let name = path.display().to_string();
    let is_yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    );
    let result = Document::read(path).and_then(|doc| {
        if !is_yaml {
            return Ok(conf::lint_nccl_conf(&doc, opts));
        }
        match yaml_kind(&doc) {
            "recipe" => lint_recipe(&LoadedRecipe::parse(doc)?, opts),
            _ => lint_preset(path, doc, opts),
        }
    });
    result.unwrap_or_else(|err| FileReport {
        file: name.clone(),
        kind: if is_yaml { "yaml" } else { "nccl.conf" },
        nccl: None,
        findings: vec![error_finding(&name, &err)],
        unreadable: true,
    })
}

fn error_finding(file: &str, err: &Error) -> Finding {
    let (at, message, help) = match err {
        Error::Invalid(inv) => (
            inv.at.clone(),
            match &inv.field {
                Some(f) => format!("field `{f}`: {}", inv.message),
                None => inv.message.clone(),
            },
            inv.help.clone(),
        ),
        // These name their own place; the finding is printed at it, so the message leaves
        // it out rather than naming the file twice.
        Error::UnknownPreset {
            referenced_at: at, ..
        }
        | Error::PresetCycle { at, .. } => {
            let text = err.to_string();
            let message = text.strip_prefix(&format!("{at}: ")).unwrap_or(&text);
            (at.clone(), message.to_string(), None)
        }
        other => (
            Location {
                file: file.to_string(),
                line: None,
                column: None,
            },
            other.to_string(),
            None,
        ),
    };
    Finding {
        severity: Severity::Error,
        code: "invalid-input",
        at,
        var: None,
        via: None,
        message,
        help,
    }
}

/// Recipes name a PyTorch version and a base; presets have neither.
fn yaml_kind(doc: &Document) -> &'static str {
    let recipe_keys = ["pytorch", "base", "presets", "gpus"];
    let keys = doc.top_keys();
    if keys.iter().any(|k| recipe_keys.contains(k))
        || (keys.is_empty() && !doc.name().contains("preset"))
    {
        "recipe"
    } else {
        "preset"
    }
}

/// Rules about the variable's name rather than its value; their findings point at the key.
const NAME_RULES: &[&str] = &[
    "unknown-name",
    "torch-name",
    "export",
    "name-spaces",
    "removed",
    "too-new",
    "deprecated",
    "no-effect",
];

/// A recipe whose NCCL settings need libraries of the OS (`nccl::needs`: libibverbs for the
/// IB transport) while its `system:` installs nothing. Lint does not read the base, which may
/// have them; `build` and `resolve --from` check it. The finding points at the setting, or at
/// the recipe's `presets` when a preset made it.
fn unmet_os_need(loaded: &LoadedRecipe, env: &crate::preset::MergedEnv) -> Option<Finding> {
    if !loaded.recipe.system.is_empty() {
        return None;
    }
    let settings: Vec<(String, String)> = (env.0.iter())
        .map(|(name, var)| (name.clone(), var.value.clone()))
        .collect();
    let need = crate::nccl::needs::of(&settings)?;
    let (var, merged) = env.0.iter().find(|(name, _)| {
        need.because
            .split(", ")
            .any(|b| b.split('=').next() == Some(name))
    })?;
    let at = if merged.origin.by == "recipe" {
        loaded.doc.locate(&["env", var], true)
    } else {
        loaded.doc.locate(&["presets"], true)
    };
    Some(Finding {
        severity: Severity::Warning,
        code: "os-need",
        at,
        var: Some(var.clone()),
        via: None,
        message: need.warning_unread_base(),
        help: None,
    })
}

/// Places issues at the setting's key or value, dropping the warnings it allows knowingly.
fn place<'a>(
    issues: Vec<Issue>,
    (at_key, at_value): (Location, Location),
    var: &'a str,
    allow: &'a [String],
) -> impl Iterator<Item = Finding> + 'a {
    issues
        .into_iter()
        .filter(move |i| i.severity == Severity::Error || !allow.iter().any(|a| a == i.code))
        .map(move |i| Finding {
            severity: i.severity,
            code: i.code,
            at: if NAME_RULES.contains(&i.code) {
                at_key.clone()
            } else {
                at_value.clone()
            },
            var: Some(var.to_string()),
            via: None,
            message: i.message,
            help: i.help,
        })
}

fn lint_recipe(loaded: &LoadedRecipe, opts: &LintOptions) -> Result<FileReport, Error> {
    let file = loaded.doc.name().to_string();
    let mut findings = Vec::new();
    // A probe image (`pytorch: none`) has nothing to resolve and pins no NCCL: its presets
    // are checked against NCCL's table alone.
    let resolved =
        (!loaded.recipe.is_probe_image()).then(|| resolve::resolve_recipe(loaded, &opts.resolve));
    let (env, layers, nccl, nccl_from) = match resolved {
        None => {
            let probe = resolve::resolve_probe(loaded, &opts.resolve)?;
            (probe.env, probe.layers, None, "")
        }
        Some(Ok(resolved)) => {
            if resolved.lock.nccl.version.is_none() && opts.nccl.is_none() {
                findings.push(Finding {
                    severity: Severity::Warning,
                    code: "unknown-nccl",
                    at: loaded.doc.locate(&[], false),
                    var: None,
                    via: None,
                    message: format!(
                        "the {}, so the checks against the NCCL version are skipped",
                        resolved.lock.nccl.rule
                    ),
                    help: Some("lint with --nccl VERSION for the NCCL the image holds".into()),
                });
            }
            let pinned = Some(resolved.lock.nccl.version.clone());
            (
                resolved.lock.env,
                resolved.layers,
                pinned,
                "pinned by the lock",
            )
        }
        Some(Err(Error::Unsatisfiable(conflict))) => {
            findings.push(Finding {
                severity: Severity::Error,
                code: "unresolvable",
                at: loaded.doc.locate(&[], false),
                var: None,
                via: None,
                message: conflict.to_string(),
                help: None,
            });
            let layers = resolve::load_layers(loaded, &opts.resolve)?;
            (resolve::merge_env(loaded, &layers), layers, None, "")
        }
        Some(Err(other)) => return Err(other),
    };
    let nccl = opts.nccl.clone().or(nccl.flatten());
    let ctx = Context {
        nccl: nccl.clone(),
        nccl_from: if opts.nccl.is_some() {
            "given with --nccl"
        } else {
            nccl_from
        }
        .to_string(),
        debug: false,
    };
    let no_allow = Vec::new();
    for (var, merged) in &env.0 {
        let layer = layers
            .iter()
            .find(|p| format!("preset {}", p.name) == merged.origin.by);
        let (at, allow, via) = match layer {
            Some(p) => (
                (
                    p.doc.locate(&["env", var], true),
                    p.doc.locate(&["env", var, "value"], false),
                ),
                p.file.env.0.get(var).map(|s| &s.allow).unwrap_or(&no_allow),
                Some(file.clone()),
            ),
            None => (
                (
                    loaded.doc.locate(&["env", var], true),
                    loaded.doc.locate(&["env", var], false),
                ),
                &no_allow,
                None,
            ),
        };
        let mut issues = check_var(var, &merged.value, &ctx);
        issues.extend(links::check_links(var, &merged.value, &loaded.recipe.gpus));
        issues.extend(secret(var));
        findings.extend(place(issues, at, var, allow).map(|mut f| {
            f.via = via.clone();
            f
        }));
    }
    findings.extend(preset_conflicts(loaded, &layers));
    findings.extend(unmet_os_need(loaded, &env));
    Ok(FileReport {
        file,
        kind: "recipe",
        nccl: nccl.map(|v| v.to_string()),
        findings,
        unreadable: false,
    })
}

fn lint_preset(path: &Path, doc: Document, opts: &LintOptions) -> Result<FileReport, Error> {
    let file = doc.name().to_string();
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("preset")
        .to_string();
    let preset = Preset::parse(stem, doc)?;
    let mut dirs = vec![path.parent().map(Path::to_path_buf).unwrap_or_default()];
    dirs.extend(opts.resolve.preset_dirs.iter().cloned());
    let catalog = Catalog::from_env(&dirs);
    let mut parents = Vec::new();
    for (i, parent) in preset.file.extends.iter().enumerate() {
        let at = preset.doc.locate(&["extends", &i.to_string()], false);
        parents.extend(catalog.layers(&[(parent.clone(), at)], path.parent())?);
    }
    let own_floor = preset.file.requires.nccl.as_ref().and_then(|c| c.floor());
    let floor = own_floor.into_iter().chain(nccl_floor(&parents)).max();
    let (nccl, nccl_from) = match (&opts.nccl, floor) {
        (Some(v), _) => (v.clone(), "given with --nccl".to_string()),
        (None, Some(v)) => (v, "the lowest the preset's `requires` allows".to_string()),
        (None, None) => {
            let oldest = Compat::embedded().nccl_versions()[0].clone();
            (
                oldest,
                "the oldest any PyTorch build ships; the preset sets no `requires`".to_string(),
            )
        }
    };
    let ctx = Context {
        nccl: Some(nccl.clone()),
        nccl_from,
        debug: preset.file.debug,
    };
    let mut findings = Vec::new();
    for (var, setting) in &preset.file.env.0 {
        let at = (
            preset.doc.locate(&["env", var], true),
            preset.doc.locate(&["env", var, "value"], false),
        );
        let mut issues = check_var(var, &setting.value, &ctx);
        issues.extend(secret(var));
        findings.extend(place(issues, at, var, &setting.allow));
    }
    Ok(FileReport {
        file,
        kind: "preset",
        nccl: Some(nccl.to_string()),
        findings,
        unreadable: false,
    })
}

/// A variable whose name says it holds a secret: baked into an image, every puller reads
/// it, and `certify` fails the image for it.
fn secret(var: &str) -> Option<Issue> {
    looks_secret(var).then(|| Issue {
        severity: Severity::Error,
        code: "secret",
        message: format!(
            "{var} looks like a secret: an image's environment is readable by everyone who \
             pulls it, and certify fails it"
        ),
        help: Some("pass it at run time (`docker run -e`, a Kubernetes Secret)".into()),
    })
}

/// Presets of one recipe that set a variable to different values while neither extends the
/// other: two answers to one question (`[nvlink, pcie]` names two topologies), where the
/// later one wins only by its place in the list. A preset marked `debug: true` is an overlay
/// and overrides on purpose.
fn preset_conflicts(loaded: &LoadedRecipe, layers: &[Preset]) -> Vec<Finding> {
    let ancestors = |name: &str| -> Vec<String> {
        let mut seen = Vec::new();
        let mut todo = vec![name.to_string()];
        while let Some(n) = todo.pop() {
            if let Some(p) = layers.iter().find(|p| p.name == n) {
                for parent in &p.file.extends {
                    if !seen.contains(parent) {
                        seen.push(parent.clone());
                        todo.push(parent.clone());
                    }
                }
            }
        }
        seen
    };
    let mut findings = Vec::new();
    let mut reported: Vec<(String, String)> = Vec::new();
    for (i, later) in layers.iter().enumerate() {
        if later.file.debug {
            continue;
        }
        let later_ancestors = ancestors(&later.name);
        for earlier in &layers[..i] {
            if later_ancestors.contains(&earlier.name)
                || ancestors(&earlier.name).contains(&later.name)
                || reported.contains(&(earlier.name.clone(), later.name.clone()))
            {
                continue;
            }
            let clashes: Vec<String> = later
                .file
                .env
                .0
                .iter()
                // The recipe's own `env:` settles it.
                .filter(|(var, _)| !loaded.recipe.env.0.contains_key(*var))
                .filter_map(|(var, setting)| {
                    let other = earlier.file.env.0.get(var)?;
                    (other.value != setting.value).then(|| {
                        format!(
                            "{var}={} (preset {}) against {var}={} (preset {})",
                            other.value, earlier.name, setting.value, later.name
                        )
                    })
                })
                .collect();
            if clashes.is_empty() {
                continue;
            }
            reported.push((earlier.name.clone(), later.name.clone()));
            let index = loaded
                .recipe
                .presets
                .iter()
                .position(|p| *p == later.name)
                .map(|i| i.to_string());
            let at = match &index {
                Some(i) => loaded.doc.locate(&["presets", i], false),
                None => loaded.doc.locate(&["presets"], true),
            };
            findings.push(Finding {
                severity: Severity::Error,
                code: "preset-conflict",
                at,
                var: None,
                via: None,
                message: format!(
                    "presets {} and {} contradict each other: {}; the later wins only by its \
                     place in the list",
                    earlier.name,
                    later.name,
                    clashes.join(", ")
                ),
                help: Some(
                    "keep the one preset that describes these nodes, or set the variable in the \
                     recipe's `env:` to say which value is meant"
                        .into(),
                ),
            });
        }
    }
    findings
}

/// The errors `lint` reports for a loaded recipe, as `build` checks them before it builds:
/// an image made from a recipe with lint errors or secrets would fail `certify`.
pub fn gate(loaded: &LoadedRecipe, resolve: &Options) -> Result<(), Error> {
    let report = lint_recipe(
        loaded,
        &LintOptions {
            nccl: None,
            resolve: resolve.clone(),
        },
    )?;
    let errors: Vec<String> = report
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| format!("  {}", f.to_string().replace('\n', "\n  ")))
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "{}: the lint finds {} error{} that certify would fail the image for:\n{}\n  fix \
         them, or build anyway with --skip-checks",
        report.file,
        errors.len(),
        if errors.len() == 1 { "" } else { "s" },
        errors.join("\n")
    )))
}

/// Counts of a whole lint run.
#[derive(Debug, Default, Serialize)]
pub struct Totals {
    /// Files checked.
    pub files: usize,
    /// Errors.
    pub errors: usize,
    /// Warnings.
    pub warnings: usize,
}

impl Totals {
    /// The verdict of a run with these totals: a failure on errors and, when `strict`, on
    /// warnings.
    pub fn verdict(&self, strict: bool) -> Verdict {
        let statuses = std::iter::repeat_n(Status::Fail, self.errors)
            .chain(std::iter::repeat_n(Status::Warn, self.warnings));
        Verdict::of_statuses(statuses, false, strict)
    }
}

/// Adds up findings across files.
pub fn totals(reports: &[FileReport]) -> Totals {
    let mut t = Totals {
        files: reports.len(),
        ..Totals::default()
    };
    for f in reports.iter().flat_map(|r| &r.findings) {
        match f.severity {
            Severity::Error => t.errors += 1,
            Severity::Warning => t.warnings += 1,
        }
    }
    t
}

/// Variable names that hold secrets and must not be baked into an image.
pub fn looks_secret(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    n.ends_with("_TOKEN")
        || n.ends_with("_KEY")
        || n.contains("PASSWORD")
        || n.contains("SECRET")
        || n.ends_with("_CREDENTIALS")
        || n == "TOKEN"
        || n == "API_KEY"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(name: &str, value: &str, nccl: Option<&str>) -> Vec<&'static str> {
        let ctx = Context {
            nccl: nccl.map(|v| v.parse().unwrap()),
            nccl_from: "test".into(),
            debug: false,
        };
        check_var(name, value, &ctx)
            .into_iter()
            .map(|i| i.code)
            .collect()
    }

    #[test]
    fn typos_get_a_suggestion() {
        let issues = check_var("NCCL_P2P_DISABLED", "1", &Context::default());
        assert_eq!(issues[0].code, "unknown-name");
        assert!(
            issues[0].message.contains("did you mean NCCL_P2P_DISABLE"),
            "{:?}",
            issues
        );
        assert_eq!(codes("nccl_debug", "WARN", None), ["unknown-name"]);
        assert!(
            check_var("NCCL_TOTALLY_MADE_UP_THING", "1", &Context::default())[0]
                .help
                .is_none()
        );
    }

    #[test]
    fn integer_quirks_are_caught() {
        assert_eq!(codes("NCCL_IB_TIMEOUT", "twenty", None), ["not-a-number"]);
        assert!(codes("NCCL_BUFFSIZE", "4M", None).contains(&"trailing-text"));
        // NCCL tests "a multiple of 32" before the maximum (getNthreads): 1000 is not a
        // multiple, 1024 is above 512.
        assert!(codes("NCCL_NTHREADS", "1024", None).contains(&"out-of-range"));
        assert!(codes("NCCL_NTHREADS", "1000", None).contains(&"not-a-multiple"));
        assert!(codes("NCCL_NTHREADS", "100", None).contains(&"not-a-multiple"));
        assert!(codes("NCCL_NTHREADS", "0256", None).contains(&"octal"));
        assert_eq!(codes("NCCL_NTHREADS", "256", None), ["production-risk"]);
        assert!(codes("NCCL_P2P_DISABLE", "true", None).contains(&"not-a-number"));
    }

    #[test]
    fn enum_case_and_lists() {
        assert_eq!(codes("NCCL_P2P_LEVEL", "nvl", None), ["case"]);
        assert!(codes("NCCL_P2P_LEVEL", "NVL", None).is_empty());
        assert!(codes("NCCL_ALGO", "Ring,Tre", None).contains(&"unknown-value"));
        assert!(codes("NCCL_ALGO", "Ring,", None).contains(&"empty-entry"));
        assert!(
            codes(
                "NCCL_ALGO",
                "allreduce:ring;allgather:^Tree",
                Some("2.27.5")
            )
            .iter()
            .all(|c| *c == "production-risk")
        );
        assert!(codes("NCCL_ALGO", "allreduce:ring", Some("2.21.5")).contains(&"list-syntax"));
        assert!(codes("NCCL_PROTO", "Simple;LL", None).contains(&"list-syntax"));
    }

    #[test]
    fn versions_are_checked_against_the_pin() {
        assert!(codes("NCCL_CHECK_MODE", "DEFAULT", Some("2.27.5")).contains(&"too-new"));
        assert!(!codes("NCCL_CHECK_MODE", "DEFAULT", Some("2.29.7")).contains(&"too-new"));
        assert_eq!(codes("NCCL_LL_THRESHOLD", "0", Some("2.27.5")), ["removed"]);
        assert!(codes("NCCL_MIN_NCHANNELS", "4", Some("2.27.5")).contains(&"deprecated"));
    }

    #[test]
    fn production_risks_depend_on_the_value() {
        assert!(codes("NCCL_DEBUG", "INFO", None).contains(&"production-risk"));
        assert!(codes("NCCL_DEBUG", "WARN", None).is_empty());
        assert!(codes("NCCL_P2P_DISABLE", "1", None).contains(&"production-risk"));
        assert!(codes("NCCL_P2P_DISABLE", "0", None).is_empty());
        assert!(codes("NCCL_SOCKET_IFNAME", "^docker,lo", None).is_empty());
        let debug = Context {
            debug: true,
            ..Context::default()
        };
        assert!(check_var("NCCL_DEBUG", "INFO", &debug).is_empty());
    }
}
