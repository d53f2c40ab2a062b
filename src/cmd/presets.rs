//! `gpubake presets`: list, show and compare NCCL presets.

use crate::error::{Location, Result};
use crate::preset::{Catalog, MergedEnv, MergedVar};
use clap::Subcommand;
use std::path::PathBuf;

/// `gpubake presets`' arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    /// Print as JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Look up presets here before the built-in ones (repeatable).
    #[arg(long, value_name = "DIR", global = true)]
    preset_dir: Vec<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Every preset visible through the search path.
    List,
    /// One preset merged with what it extends.
    Show {
        /// Preset name or path.
        name: String,
    },
    /// What differs between two merged presets; exits 1 when they differ, as diff(1) does.
    Diff {
        /// First preset.
        a: String,
        /// Second preset.
        b: String,
    },
}

/// Runs the action on the presets the search path finds.
pub fn run(args: Args) -> Result<i32> {
    let catalog = Catalog::from_env(&args.preset_dir);
    let here = Location {
        file: "command line".into(),
        line: None,
        column: None,
    };
    let merged = |name: &str| -> Result<MergedEnv> {
        let layers = catalog.layers(&[(name.to_string(), here.clone())], None)?;
        // A local file of a built-in preset's name wins without a word otherwise, and the
        // values shown would not be the ones the name means elsewhere.
        for layer in layers.iter().filter(|l| l.shadows_builtin()) {
            eprintln!(
                "note: preset `{}` is read from {}, which takes the place of the built-in \
                 preset of that name",
                layer.name,
                layer.doc.name()
            );
        }
        Ok(MergedEnv::from_layers(&layers))
    };
    match args.action {
        Action::List => Ok(list(&catalog, &here, args.json)),
        Action::Show { name } => {
            show(&merged(&name)?, args.json);
            Ok(0)
        }
        Action::Diff { a, b } => Ok(diff((&a, &merged(&a)?), (&b, &merged(&b)?), args.json)),
    }
}

/// `presets list`; exits 2 when a preset's file is broken.
fn list(catalog: &Catalog, here: &Location, json: bool) -> i32 {
    #[derive(serde::Serialize)]
    struct Row {
        name: String,
        description: String,
        extends: Vec<String>,
        requires_nccl: Option<String>,
        debug: bool,
        file: String,
    }
    let (presets, broken) = catalog.load_all(here);
    let rows: Vec<Row> = presets
        .into_iter()
        .map(|(name, p)| Row {
            name,
            requires_nccl: p.file.requires.nccl.as_ref().map(ToString::to_string),
            debug: p.file.debug,
            file: p.doc.name().to_string(),
            description: p.file.description,
            extends: p.file.extends,
        })
        .collect();
    for b in &broken {
        eprintln!("error: preset {b}");
    }
    if json {
        super::print_json(&rows);
    } else {
        for r in &rows {
            let extends = if r.extends.is_empty() {
                String::new()
            } else {
                format!(" (extends {})", r.extends.join(", "))
            };
            println!("{:<12} {}{extends}", r.name, r.description);
        }
    }
    // A broken file is bad input.
    if broken.is_empty() { 0 } else { 2 }
}

/// `presets show`: every variable with where its value comes from.
fn show(env: &MergedEnv, json: bool) {
    if json {
        super::print_json(env);
        return;
    }
    for (var, v) in &env.0 {
        println!("{var}={}", v.value);
        println!("    from {} ({})", v.origin.by, v.origin.at);
        if let Some(reason) = &v.reason {
            println!("    why: {reason}");
        }
        for r in &v.replaced {
            println!("    replaces {}={} from {}", var, r.value, r.by);
        }
    }
}

/// `presets diff`: exits 1 when the presets differ, diff(1)'s convention, so scripts can test
/// for a difference.
fn diff((a, ea): (&str, &MergedEnv), (b, eb): (&str, &MergedEnv), json: bool) -> i32 {
    let mut names: Vec<&String> = ea.0.keys().chain(eb.0.keys()).collect();
    names.sort();
    names.dedup();
    let mut rows = Vec::new();
    for var in names {
        let (va, vb) = (ea.0.get(var), eb.0.get(var));
        if va.map(|v| &v.value) == vb.map(|v| &v.value) {
            continue;
        }
        rows.push(serde_json::json!({
            "var": var,
            a: va.map(|v| serde_json::json!({"value": v.value, "from": v.origin.by})),
            b: vb.map(|v| serde_json::json!({"value": v.value, "from": v.origin.by})),
        }));
        if !json {
            let show = |v: Option<&MergedVar>| match v {
                Some(v) => format!("{} ({})", v.value, v.origin.by),
                None => "(unset)".to_string(),
            };
            println!("{var}\n    {a}: {}\n    {b}: {}", show(va), show(vb));
        }
    }
    if json {
        super::print_json(&rows);
    } else if rows.is_empty() {
        println!("{a} and {b} set the same values");
    }
    if rows.is_empty() { 0 } else { 1 }
}
