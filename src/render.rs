//! Lock -> Dockerfile, for teams that build with BuildKit. The output is self-contained: the
//! preset and the lock are written by `RUN` steps, so no build context beyond the Dockerfile
//! is needed.

use crate::error::{Error, Location, Result};
use crate::lock::{LOCK_PATH_IN_IMAGE, Lock};
use minijinja::{Environment, context};

/// The template shipped in the repository root, embedded.
pub const DEFAULT_TEMPLATE: &str = include_str!("../Dockerfile.template");

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

/// Renders `template` (named `template_name` in errors) for `lock`.
pub fn render(lock: &Lock, template: &str, template_name: &str) -> Result<String> {
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
    let nccl_conf: Vec<String> = lock.env.nccl_conf().lines().map(String::from).collect();
    let labels: Vec<_> = lock
        .labels
        .iter()
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
