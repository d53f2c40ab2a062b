//! Lock -> Dockerfile and its build context, for teams that build with BuildKit or the
//! Docker Engine. The Dockerfile makes the same image contents as `gpubake build`: a build
//! stage runs gpubake's own installer on the closure's wheels (each checked by its sha256),
//! and the final stage copies the installed tree, the probe and the recipe's files; the preset
//! and the lock are written by `RUN` steps.

use crate::closure::Closure;
use crate::error::{Error, Location, Result};
use crate::image::layer::{Entry, ROOT, Source, tree_entries};
use crate::lock::{LOCK_PATH_IN_IMAGE, Lock};
use crate::names::VENV;
use crate::recipe::LoadedRecipe;
use crate::wheel::cache::WheelCache;
use minijinja::{Environment, context};
use std::path::{Path, PathBuf};

/// What the build context holds beside the Dockerfile.
#[derive(Clone, Debug, Default)]
pub struct ContextPlan {
    /// The Python stack is installed (a closure and its wheels are in the context).
    pub stack: bool,
    /// The recipe's files: where each is in the context, and its destination.
    pub files: Vec<ContextFile>,
}

/// One of the recipe's `files:` in the build context.
#[derive(Clone, Debug)]
pub struct ContextFile {
    /// Its source on disk.
    pub source: PathBuf,
    /// Its path in the context (`files/0`).
    pub context: String,
    /// Its destination in the image.
    pub dest: String,
    /// Permission bits for regular files, when the recipe sets them.
    pub mode: Option<u32>,
}

impl ContextPlan {
    /// The context of a recipe's image; `stack` is false for an image without Python.
    pub fn for_recipe(loaded: &LoadedRecipe, stack: bool) -> Result<Self> {
        let files = loaded
            .file_sources()?
            .into_iter()
            .enumerate()
            .map(|(i, (source, f))| ContextFile {
                source,
                context: format!("files/{i}"),
                dest: f.dest.clone(),
                mode: f.mode_bits(),
            })
            .collect();
        Ok(ContextPlan { stack, files })
    }

    /// Every entry of the context: the Dockerfile, the probe binary, the closure and its
    /// wheels (laid out as a wheel cache, so the installer verifies each by its sha256), and
    /// the recipe's files.
    pub fn entries(
        &self,
        dockerfile: &str,
        probe: &Path,
        stack: Option<(&Closure, &WheelCache)>,
    ) -> Result<Vec<Entry>> {
        let mut out = vec![
            Entry {
                path: "Dockerfile".into(),
                mode: 0o644,
                owner: ROOT,
                source: Source::Bytes(dockerfile.as_bytes().to_vec()),
            },
            Entry {
                path: "gpubake".into(),
                mode: 0o755,
                owner: ROOT,
                source: Source::File(probe.to_path_buf()),
            },
        ];
        if let Some((closure, cache)) = stack {
            out.push(Entry {
                path: "pylock.toml".into(),
                mode: 0o644,
                owner: ROOT,
                source: Source::Bytes(closure.text.clone().into_bytes()),
            });
            for w in &closure.wheels {
                let path = cache.path(&w.sha256);
                let rel = path
                    .strip_prefix(cache.root())
                    .expect("cache paths live under the cache root");
                out.push(Entry {
                    path: format!("cache/{}", rel.display()),
                    mode: 0o644,
                    owner: ROOT,
                    source: Source::File(path),
                });
            }
        }
        for f in &self.files {
            out.extend(tree_entries(&f.source, &f.context, f.mode)?);
        }
        Ok(out)
    }
}

/// Writes a context's entries under `dir` (created if missing), as `docker build` will read
/// them: the files a layer of them would hold, with their modes.
pub fn write_context(entries: Vec<Entry>, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::writing(dir, e))?;
    crate::image::layer::materialize(entries, 0, dir)
}

impl ContextPlan {
    /// The context of `loaded`'s image with its Dockerfile, rendered for `lock` from the
    /// template at `template` (the built-in one when absent); `stack` is false for an image
    /// without Python.
    pub fn with_dockerfile(
        loaded: &LoadedRecipe,
        lock: &Lock,
        stack: bool,
        template: Option<&Path>,
    ) -> Result<(Self, String)> {
        let plan = ContextPlan::for_recipe(loaded, stack)?;
        let (text, name) = read_template(template)?;
        let dockerfile = render(lock, &plan, &text, &name)?;
        Ok((plan, dockerfile))
    }

    /// Every entry of the context (see [`ContextPlan::entries`]), with this gpubake as the
    /// probe and the closure a build of `lock` installs (see [`crate::closure::for_build`]),
    /// whose wheels are fetched into the wheel cache first.
    pub fn entries_for_build(
        &self,
        loaded: &LoadedRecipe,
        lock: &Lock,
        dockerfile: &str,
        recipe_file: Option<&Path>,
        pylock: Option<&Path>,
        offline: bool,
    ) -> Result<Vec<Entry>> {
        use crate::wheel::cache::FetchOptions;
        let probe = std::env::current_exe().map_err(|e| Error::reading("current executable", e))?;
        if !self.stack {
            return self.entries(dockerfile, &probe, None);
        }
        let cache_dir = WheelCache::default_root()?;
        let closure = crate::closure::for_build(
            lock,
            &crate::closure::Source {
                recipe_file,
                explicit: pylock,
                index: loaded.recipe.index.as_deref(),
                offline,
                cache_dir: &cache_dir,
            },
        )?;
        let cache = WheelCache::open(cache_dir)?;
        cache.fetch(
            &closure.wheels,
            &FetchOptions {
                offline,
                ..Default::default()
            },
        )?;
        self.entries(dockerfile, &probe, Some((&closure, &cache)))
    }
}

/// The Dockerfile template: the file at `path`, or the built-in one; with the name its errors
/// give it.
pub fn read_template(path: Option<&Path>) -> Result<(String, String)> {
    match path {
        Some(p) => Ok((
            std::fs::read_to_string(p).map_err(|e| Error::reading(p, e))?,
            p.display().to_string(),
        )),
        None => Ok((
            DEFAULT_TEMPLATE.to_string(),
            "Dockerfile.template".to_string(),
        )),
    }
}

/// The template shipped in the repository root, embedded.
pub const DEFAULT_TEMPLATE: &str = include_str!("../../Dockerfile.template");

/// Quotes a string for a POSIX shell: `it's` becomes `'it'\''s'`.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Quotes a string for a Dockerfile `ENV` or `LABEL` value: double quotes, with `\`, `"` and
/// `$` escaped so the builder takes it literally.
pub fn dockerfile_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if matches!(c, '\\' | '"' | '$') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Renders `template` (named `template_name` in errors) for `lock`, with a build context laid
/// out as `plan` says.
pub fn render(
    lock: &Lock,
    plan: &ContextPlan,
    template: &str,
    template_name: &str,
) -> Result<String> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.add_filter("sh", |s: String| shell_quote(&s));
    env.add_filter("dq", |s: String| dockerfile_quote(&s));
    let template_error = |e: minijinja::Error| {
        Error::invalid(
            Location {
                file: template_name.to_string(),
                line: e.line(),
                column: None,
            },
            None,
            e.to_string(),
            Some("a minijinja template; `gpubake render --help` lists the variables".into()),
        )
    };
    env.add_template("Dockerfile", template)
        .map_err(template_error)?;
    let lock_yaml = lock.to_yaml();
    let env_list: Vec<_> = lock
        .image_env()
        .into_iter()
        .map(|(name, value)| context! { name, value })
        .collect();
    let files: Vec<_> = plan
        .files
        .iter()
        .map(|f| context! { src => f.context.clone(), dest => f.dest.clone() })
        .collect();
    let nccl_conf: Vec<String> = lock.env.nccl_conf().lines().map(String::from).collect();
    let (stack_key, stack_value) = crate::bake::stack::stack_label(plan.stack);
    let labels: Vec<_> = lock
        .labels
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .chain([(stack_key, stack_value)])
        .map(|(key, value)| context! { key, value })
        .collect();
    let python = lock
        .python
        .version
        .as_ref()
        .map(|v| v.to_string())
        .unwrap_or_default();
    let out = env
        .get_template("Dockerfile")
        .and_then(|t| {
            t.render(context! {
                lock => minijinja::Value::from(minijinja::value::Serde(lock)),
                python,
                requirements => lock.requirements(),
                pip => lock.pip.clone(),
                env => env_list,
                nccl_conf,
                lock_lines => lock_yaml.lines().map(String::from).collect::<Vec<_>>(),
                lock_path => LOCK_PATH_IN_IMAGE,
                labels,
                stack => plan.stack,
                venv => VENV,
                files,
                version => env!("CARGO_PKG_VERSION"),
            })
        })
        .map_err(template_error)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_hostile_text() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(
            dockerfile_quote(r#"a "b" $HOME \n"#),
            r#""a \"b\" \$HOME \\n""#
        );
    }
}
