//! `cargo bench --bench pipeline`: time of each stage for every shipped recipe, next to the
//! time serde_yaml alone takes to parse the same file (the peer every stage starts with).
//! Medians over many runs; the table is printed, nothing is asserted.

use gpubake::bake::render::{ContextPlan, DEFAULT_TEMPLATE, render};
use gpubake::document::Document;
use gpubake::lint::{LintOptions, lint_file};
use gpubake::recipe::LoadedRecipe;
use gpubake::resolve::{Options, resolve_recipe};
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

const RUNS: usize = 200;

/// Median wall time of `f` over `RUNS` runs, after a few warm-up runs.
fn median(mut f: impl FnMut()) -> Duration {
    for _ in 0..5 {
        f();
    }
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::set_current_dir(root).expect("the crate root exists");
    let mut recipes: Vec<_> = std::fs::read_dir("recipes")
        .expect("recipes/ exists")
        .map(|e| e.expect("readable").path())
        .collect();
    recipes.sort();
    let opts = Options::default();
    let lint_opts = LintOptions {
        nccl: None,
        resolve: Options::default(),
    };

    println!(
        "median of {RUNS} runs, microseconds; ratios are against serde_yaml parsing the same file"
    );
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "recipe", "yaml", "load", "resolve", "lint", "render", "resolve/x", "lint/x"
    );
    for path in &recipes {
        let text = std::fs::read_to_string(path).expect("readable recipe");
        let yaml = median(|| {
            black_box(serde_yaml::from_str::<serde_yaml::Value>(&text).expect("valid YAML"));
        });
        let load = median(|| {
            black_box(
                LoadedRecipe::parse(Document::from_text("r.yaml", text.as_str()))
                    .expect("valid recipe"),
            );
        });
        let loaded = LoadedRecipe::read(path).expect("valid recipe");
        let resolve = median(|| {
            black_box(resolve_recipe(&loaded, &opts).expect("resolves"));
        });
        let lint = median(|| {
            black_box(lint_file(path, &lint_opts));
        });
        let lock = resolve_recipe(&loaded, &opts).expect("resolves").lock;
        let plan = ContextPlan::for_recipe(&loaded, true).expect("files exist");
        let rendered = median(|| {
            black_box(
                render(&lock, &plan, DEFAULT_TEMPLATE, "Dockerfile.template").expect("renders"),
            );
        });
        let ratio = |d: Duration| format!("{:.0}x", d.as_secs_f64() / yaml.as_secs_f64());
        println!(
            "{:<36} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            path.file_name().unwrap().to_string_lossy(),
            us(yaml),
            us(load),
            us(resolve),
            us(lint),
            us(rendered),
            ratio(resolve),
            ratio(lint),
        );
    }
    println!(
        "resolve and lint include reading the presets they use from env-presets/; lint also resolves the recipe"
    );
}
