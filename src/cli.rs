//! The command line: a thin shell that parses arguments, calls one stage, and prints its
//! result as text or JSON. Exit codes: 0 pass, 1 a check failed, 2 bad input or usage,
//! 3 something the environment lacks.

use crate::compat::Compat;
use crate::error::{Error, Location, Result};
use crate::lint::{self, LintOptions};
use crate::preset::{Catalog, MergedEnv};
use crate::recipe::{DEFAULT_RECIPE, LoadedRecipe};
use crate::render;
use crate::resolve::{self, Options};
use crate::version::Version;
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Build and certify container images for GPU training.
#[derive(Parser, Debug)]
#[command(name = "gpubake", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Resolve a recipe into a lock: exact, ABI-compatible pins, each with the rule that chose it.
    ///
    /// Without RECIPE, resolves the built-in default (PyTorch 2.9 on CUDA 12.8 for H100/H200).
    /// When nothing fits, exits 2 and says which constraint refused what, and what would run.
    ///
    /// Example: gpubake resolve recipes/h100-pytorch2.9.yaml -o gpubake.lock --driver 550.54.15
    Resolve {
        /// The recipe (YAML).
        recipe: Option<PathBuf>,
        /// Write the lock here (atomically) instead of to standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The fleet's oldest driver; overrides the recipe's `driver`.
        #[arg(long, value_name = "VERSION")]
        driver: Option<Version>,
        /// Also list every candidate build and why it was refused.
        #[arg(long)]
        explain: bool,
        /// Print the lock as JSON.
        #[arg(long)]
        json: bool,
        /// Look up presets here before the built-in ones (repeatable).
        #[arg(long, value_name = "DIR")]
        preset_dir: Vec<PathBuf>,
    },
    /// Check the NCCL settings of recipes, presets and nccl.conf files.
    ///
    /// Reports unknown names, values NCCL rejects, clamps or misparses, variables the pinned
    /// NCCL does not read, and production risks. Exits 1 on errors (and on warnings with
    /// --strict).
    ///
    /// Example: gpubake lint recipes/*.yaml env-presets/*.yaml /etc/nccl.conf
    Lint {
        /// Files to check: recipes and presets (.yaml) or NCCL config files (anything else).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Treat warnings as failures.
        #[arg(long)]
        strict: bool,
        /// Check against this NCCL version instead of the one each file implies.
        #[arg(long, value_name = "VERSION")]
        nccl: Option<Version>,
        /// Print findings as JSON.
        #[arg(long)]
        json: bool,
        /// Look up presets here before the built-in ones (repeatable).
        #[arg(long, value_name = "DIR")]
        preset_dir: Vec<PathBuf>,
    },
    /// List, show and compare NCCL presets, with where each value comes from.
    ///
    /// Example: gpubake presets show nvlink; gpubake presets diff pcie nvlink
    Presets {
        #[command(subcommand)]
        action: PresetAction,
        /// Print as JSON.
        #[arg(long, global = true)]
        json: bool,
        /// Look up presets here before the built-in ones (repeatable).
        #[arg(long, value_name = "DIR", global = true)]
        preset_dir: Vec<PathBuf>,
    },
    /// Render a Dockerfile for a recipe from Dockerfile.template, for BuildKit pipelines.
    ///
    /// The template gets `lock` (the whole lock), `python`, `requirements`, `pip`, `env`,
    /// `nccl_conf`, `lock_lines`, `lock_path`, `labels` and `version`, and the filters `sh`
    /// (shell quoting) and `dq` (Dockerfile quoting).
    ///
    /// Example: gpubake render recipes/h100-pytorch2.9.yaml -o Dockerfile && docker build .
    Render {
        /// The recipe (YAML); the built-in default when absent.
        recipe: Option<PathBuf>,
        /// Write the Dockerfile here (atomically) instead of to standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Use this template instead of the built-in Dockerfile.template.
        #[arg(long, value_name = "FILE")]
        template: Option<PathBuf>,
        /// The fleet's oldest driver; overrides the recipe's `driver`.
        #[arg(long, value_name = "VERSION")]
        driver: Option<Version>,
        /// Look up presets here before the built-in ones (repeatable).
        #[arg(long, value_name = "DIR")]
        preset_dir: Vec<PathBuf>,
    },
    /// Build an image without a daemon: the base, the recipe's files, the probe, the preset.
    ///
    /// DEST and BASE use skopeo's syntax: oci:DIR[:TAG] (default) or docker-archive:FILE[:NAME:TAG].
    /// Two builds of the same recipe and base give the same digest (SOURCE_DATE_EPOCH sets the
    /// timestamps, 0 by default); unchanged layers are not written again.
    ///
    /// Example: gpubake build recipes/h100-pytorch2.9.yaml --from oci:./base:latest --to oci:./out:v1
    Build {
        /// The recipe (YAML); the built-in default when absent.
        recipe: Option<PathBuf>,
        /// Where to write the image.
        #[arg(long, value_name = "DEST")]
        to: String,
        /// The base image; the recipe's `base` when absent.
        #[arg(long, value_name = "BASE")]
        from: Option<String>,
        /// Layer compression.
        #[arg(long, value_enum, default_value = "gzip")]
        compression: crate::image::Compression,
        /// Write every layer again: the layer cache knows files by path, size and mtime.
        #[arg(long)]
        no_cache: bool,
        /// Build with the Docker engine from the rendered Dockerfile instead (DEST must be
        /// docker-daemon:NAME:TAG; BASE, if given, docker-daemon:NAME:TAG too).
        #[arg(long)]
        engine_build: bool,
        /// With --engine-build: render this template instead of the built-in Dockerfile.template.
        #[arg(long, value_name = "FILE", requires = "engine_build")]
        template: Option<PathBuf>,
        /// The fleet's oldest driver; overrides the recipe's `driver`.
        #[arg(long, value_name = "VERSION")]
        driver: Option<Version>,
        /// Look up presets here before the built-in ones (repeatable).
        #[arg(long, value_name = "DIR")]
        preset_dir: Vec<PathBuf>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show an image's pins, presets, layers and environment.
    ///
    /// Example: gpubake inspect oci:./out:v1
    Inspect {
        /// The image: oci:DIR[:TAG] or docker-archive:FILE[:NAME:TAG].
        image: String,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Re-hash every blob of an image and check that its labels, lock and nccl.conf agree.
    ///
    /// Exits 1 naming what disagrees, 2 when the image cannot be read at all.
    ///
    /// Example: gpubake verify oci:./out:v1
    Verify {
        /// The image: oci:DIR[:TAG] or docker-archive:FILE[:NAME:TAG].
        image: String,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Certify an image for CI: static checks of the image, then `gpubake probe` inside it.
    ///
    /// Static: every digest, OCI structure, pins in labels against the lock and the layers'
    /// packages, the NCCL preset linted, NVIDIA_REQUIRE_CUDA against the lock, no secrets in Env,
    /// layer count and size. Dynamic: the image is loaded into the Docker engine and the probe
    /// runs in a container with GPUs, as `docker run --gpus` asks for them. Exits 0 certified,
    /// 1 a check failed, 3 GPUs were asked for but the engine or GPU runtime is missing.
    ///
    /// Example: gpubake certify oci:./out:v1 --gpus all --out cert.json --junit cert.xml
    Certify {
        /// The image: oci:DIR[:TAG] or docker-archive:FILE[:NAME:TAG].
        image: String,
        /// GPUs for the probe: all, a number, or none (static checks only).
        #[arg(long, default_value = "all")]
        gpus: crate::engine::Gpus,
        /// Print the certificate as JSON.
        #[arg(long)]
        json: bool,
        /// Write the certificate (JSON) here.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Also write JUnit XML here.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Most layers allowed.
        #[arg(long, default_value_t = 127)]
        max_layers: usize,
        /// Largest compressed layer allowed, in GiB.
        #[arg(long, default_value_t = 20)]
        max_layer_gib: u64,
        /// Expected floors per GPU model for the probe (YAML like data/policy.yaml).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// Check a GPU node from inside the image: the toolkit's injection, NVML, the lock
    /// against the driver and the NCCL PyTorch would load.
    ///
    /// Exits 0 when every check passes (warnings included), 1 when one fails, 3 when no GPU
    /// is visible, with what to do about it.
    ///
    /// Example: docker run --rm --gpus all IMAGE gpubake probe --junit /out/probe.xml
    Probe {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Also write the report as JUnit XML here.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Shorter time budgets, fewer sizes, no NCCL runs.
        #[arg(long)]
        quick: bool,
        /// Also print the all-reduce table: the bundled kernel beside NCCL and a plain copy.
        #[arg(long)]
        bench: bool,
        /// Only these GPU indices, comma-separated.
        #[arg(long, value_name = "LIST", value_delimiter = ',')]
        devices: Option<Vec<u32>>,
        /// All-reduce message sizes: MIN:MAX in bytes (powers of 16 in between), or a comma list.
        #[arg(long, value_name = "MIN:MAX")]
        sizes: Option<String>,
        /// Expected floors per GPU model (YAML like data/policy.yaml) instead of the built-in ones.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// The probe's GPU measurements, run by `gpubake probe` in a child process.
    #[command(hide = true)]
    ProbeWorker {
        /// CUDA ordinals.
        #[arg(long, value_delimiter = ',')]
        devices: Vec<usize>,
        /// Write the JSON result here rather than to standard output, which NCCL logs to.
        #[arg(long, value_name = "FILE")]
        result: Option<PathBuf>,
        #[command(subcommand)]
        task: crate::probe::worker::Task,
    },
    /// Print the compatibility database: PyTorch builds, their pins, Pythons, archs, drivers.
    ///
    /// `?` marks values not confirmed from the shipped wheel.
    ///
    /// Example: gpubake compat --release 2.9
    Compat {
        /// Only this PyTorch release (`2.9`).
        #[arg(long)]
        release: Option<Version>,
        /// Print the whole database as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum PresetAction {
    /// Every preset visible through the search path.
    List,
    /// One preset merged with what it extends.
    Show {
        /// Preset name or path.
        name: String,
    },
    /// What differs between two merged presets.
    Diff {
        /// First preset.
        a: String,
        /// Second preset.
        b: String,
    },
}

/// Runs the parsed command line; returns the exit code.
pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Resolve {
            recipe,
            output,
            driver,
            explain,
            json,
            preset_dir,
        } => {
            let loaded = load_recipe(recipe.as_deref())?;
            let opts = Options {
                driver,
                preset_dirs: preset_dir,
            };
            let resolved = resolve::resolve_recipe(&loaded, &opts)?;
            for w in &resolved.lock.warnings {
                eprintln!("warning: {w}");
            }
            if explain {
                eprintln!("candidates ({}):", resolved.considered.len());
                let chosen = format!(
                    "torch {}+{}",
                    short(&resolved.lock.torch.version),
                    resolved.lock.torch.variant
                );
                for (label, why) in &resolved.considered {
                    match why.first() {
                        None if *label == chosen => eprintln!("  * {label}: chosen"),
                        None => eprintln!("  + {label}: admitted"),
                        Some(first) => eprintln!("  - {label}: {first}"),
                    }
                }
            }
            let text = if json {
                serde_json::to_string_pretty(&resolved.lock).expect("locks serialize") + "\n"
            } else {
                resolved.lock.to_yaml()
            };
            emit(output.as_deref(), &text)?;
            Ok(0)
        }
        Command::Lint {
            files,
            strict,
            nccl,
            json,
            preset_dir,
        } => {
            let opts = LintOptions {
                nccl,
                resolve: Options {
                    driver: None,
                    preset_dirs: preset_dir,
                },
            };
            let reports: Vec<_> = files.iter().map(|f| lint::lint_file(f, &opts)).collect();
            let totals = lint::totals(&reports);
            if json {
                let out = serde_json::json!({ "files": reports, "totals": totals });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&out).expect("reports serialize")
                );
            } else {
                for finding in reports.iter().flat_map(|r| &r.findings) {
                    println!("{finding}");
                }
                println!(
                    "{} file{} checked: {} error{}, {} warning{}",
                    totals.files,
                    plural(totals.files),
                    totals.errors,
                    plural(totals.errors),
                    totals.warnings,
                    plural(totals.warnings)
                );
            }
            Ok(if reports.iter().any(|r| r.unreadable) {
                2
            } else if totals.errors > 0 || (strict && totals.warnings > 0) {
                1
            } else {
                0
            })
        }
        Command::Presets {
            action,
            json,
            preset_dir,
        } => presets(action, json, &preset_dir),
        Command::Render {
            recipe,
            output,
            template,
            driver,
            preset_dir,
        } => {
            let loaded = load_recipe(recipe.as_deref())?;
            let opts = Options {
                driver,
                preset_dirs: preset_dir,
            };
            let resolved = resolve::resolve_recipe(&loaded, &opts)?;
            let (text, name) = read_template(template.as_deref())?;
            let dockerfile = render::render(&resolved.lock, &text, &name)?;
            emit(output.as_deref(), &dockerfile)?;
            Ok(0)
        }
        Command::Build {
            recipe,
            to,
            from,
            compression,
            no_cache,
            engine_build,
            template,
            driver,
            preset_dir,
            json,
        } => {
            let loaded = load_recipe(recipe.as_deref())?;
            let resolved = resolve::resolve_recipe(
                &loaded,
                &Options {
                    driver,
                    preset_dirs: preset_dir,
                },
            )?;
            for w in &resolved.lock.warnings {
                eprintln!("warning: {w}");
            }
            let to: crate::image::Transport = to.parse()?;
            let from: Option<crate::image::Transport> = from.map(|f| f.parse()).transpose()?;
            if engine_build {
                return engine_build_image(resolved.lock, &to, from.as_ref(), template.as_deref());
            }
            let opts = crate::image::BuildOptions {
                to,
                from,
                compression,
                epoch: crate::image::build::source_date_epoch()?,
                no_cache,
            };
            let start = std::time::Instant::now();
            let report = crate::image::build(&loaded, &resolved, &opts)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("reports serialize")
                );
            } else {
                println!(
                    "built {} in {:.2} s",
                    report.image,
                    start.elapsed().as_secs_f64()
                );
                println!("  manifest {}", report.manifest);
                for l in &report.layers {
                    println!(
                        "  {:<8} {} {:>9} {}",
                        l.name,
                        l.digest,
                        crate::image::inspect::human_size(l.size),
                        if l.reused { "reused" } else { "written" }
                    );
                }
            }
            Ok(0)
        }
        Command::Inspect { image, json } => {
            let info = crate::image::inspect::inspect(&image.parse()?)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&info).expect("inspections serialize")
                );
            } else {
                print!("{}", info.to_text());
            }
            Ok(0)
        }
        Command::Verify { image, json } => {
            let v = crate::image::inspect::verify(&image.parse()?)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).expect("verifications serialize")
                );
            } else {
                for c in &v.checks {
                    println!(
                        "{} {:<18} {}",
                        if c.ok { "ok  " } else { "FAIL" },
                        c.name,
                        c.detail
                    );
                }
                println!(
                    "{}: {}",
                    v.image,
                    if v.passed() { "verified" } else { "FAILED" }
                );
            }
            Ok(if v.passed() { 0 } else { 1 })
        }
        Command::Probe {
            json,
            junit,
            quick,
            bench,
            devices,
            sizes,
            policy,
        } => {
            let sizes = sizes.map(|s| parse_sizes(&s)).transpose()?;
            let policy = match policy {
                Some(path) => {
                    let doc = crate::document::Document::read(&path)?;
                    Some(doc.parse::<Vec<crate::probe::policy::ModelPolicy>>("policy", |_| {
                        Some("a list of {match, model, link, pcie: {gen, width}, nvlink_links, memory_gbps_floor, p2p_gbps_floor}".into())
                    })?)
                }
                None => None,
            };
            let report = crate::probe::run(&crate::probe::ProbeOptions {
                devices,
                quick,
                sizes,
                policy,
            });
            if let Some(path) = junit {
                crate::fsutil::write_atomic(&path, report.to_junit().as_bytes())?;
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("reports serialize")
                );
            } else {
                print!("{}", report.to_text());
            }
            if bench && !json {
                match report.bench_table() {
                    Some(table) => print!("{table}"),
                    None => eprintln!(
                        "gpubake: no all-reduce measurements to show (no GPU, or the all-reduce did not run)"
                    ),
                }
            }
            Ok(report.exit_code())
        }
        Command::Certify {
            image,
            gpus,
            json,
            out,
            junit,
            max_layers,
            max_layer_gib,
            policy,
        } => {
            let opts = crate::certify::CertifyOptions {
                gpus,
                max_layers,
                max_layer_bytes: max_layer_gib << 30,
                policy,
                ..Default::default()
            };
            let (report, code) = crate::certify::certify(&image.parse()?, &opts)?;
            let certificate = serde_json::to_string_pretty(&report).expect("reports serialize");
            if let Some(path) = out {
                crate::fsutil::write_atomic(&path, certificate.as_bytes())?;
            }
            if let Some(path) = junit {
                crate::fsutil::write_atomic(&path, report.to_junit().as_bytes())?;
            }
            if json {
                println!("{certificate}");
            } else {
                print!("{}", report.to_text());
                println!(
                    "{image}: {}",
                    match code {
                        0 => "certified",
                        3 => "static checks passed; the GPU probe could not run here",
                        _ => "NOT certified",
                    }
                );
            }
            Ok(code)
        }
        Command::ProbeWorker {
            devices,
            result,
            task,
        } => {
            let out = match crate::probe::worker::run(&task, &devices) {
                Ok(v) => serde_json::json!({ "ok": v }),
                Err(e) => serde_json::json!({ "error": e }),
            };
            match result {
                Some(path) => crate::fsutil::write_atomic(&path, out.to_string().as_bytes())?,
                None => println!("{out}"),
            }
            Ok(if out.get("error").is_some() { 1 } else { 0 })
        }
        Command::Compat { release, json } => {
            let db = Compat::embedded();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(db).expect("the database serializes")
                );
            } else {
                print!("{}", db.table(release.as_ref()));
            }
            Ok(0)
        }
    }
}

/// `MIN:MAX` (with K, M, G suffixes) as sizes growing 16x, or a comma list.
fn parse_sizes(text: &str) -> Result<Vec<u64>> {
    let one = |t: &str| -> Result<u64> {
        let t = t.trim();
        let (digits, mult) = match t.chars().last() {
            Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
            Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
            Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
            _ => (t, 1),
        };
        digits
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .map(|n| n * mult)
            .ok_or_else(|| Error::Usage(format!("`{t}` is not a size such as 4, 64K or 1G")))
    };
    if let Some((lo, hi)) = text.split_once(':') {
        let (lo, hi) = (one(lo)?, one(hi)?);
        if lo > hi {
            return Err(Error::Usage(format!(
                "--sizes {text}: the first size is larger than the second"
            )));
        }
        let mut out: Vec<u64> = std::iter::successors(Some(lo), |s| Some(s * 16))
            .take_while(|s| *s <= hi)
            .collect();
        if out.last() != Some(&hi) {
            out.push(hi);
        }
        Ok(out)
    } else {
        text.split(',').map(one).collect()
    }
}

/// The Dockerfile template: a file, or the built-in one.
fn read_template(path: Option<&Path>) -> Result<(String, String)> {
    match path {
        Some(p) => Ok((
            std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?,
            p.display().to_string(),
        )),
        None => Ok((
            render::DEFAULT_TEMPLATE.to_string(),
            "Dockerfile.template".to_string(),
        )),
    }
}

/// `build --engine-build`: renders the Dockerfile and has the Docker engine build it.
fn engine_build_image(
    mut lock: crate::lock::Lock,
    to: &crate::image::Transport,
    from: Option<&crate::image::Transport>,
    template: Option<&Path>,
) -> Result<i32> {
    use crate::image::Transport;
    let Transport::DockerDaemon(tag) = to else {
        return Err(Error::Usage(
            "--engine-build writes to the engine: use --to docker-daemon:NAME:TAG".into(),
        ));
    };
    match from {
        None => {}
        Some(Transport::DockerDaemon(base)) => lock.base = base.clone(),
        Some(other) => {
            return Err(Error::Usage(format!(
                "--engine-build reads its base from the engine: use --from docker-daemon:NAME:TAG, not {other}"
            )));
        }
    }
    let (text, name) = read_template(template)?;
    let dockerfile = render::render(&lock, &text, &name)?;
    let engine = crate::engine::Engine::connect()?;
    let start = std::time::Instant::now();
    engine.build(&dockerfile, tag, |line| eprintln!("{line}"))?;
    println!(
        "built docker-daemon:{tag} with the engine at {} in {:.1} s",
        engine.host(),
        start.elapsed().as_secs_f64()
    );
    Ok(0)
}

fn short(v: &Version) -> String {
    format!("{}.{}", v.major(), v.minor())
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn load_recipe(path: Option<&Path>) -> Result<LoadedRecipe> {
    match path {
        Some(p) => LoadedRecipe::read(p),
        None => {
            eprintln!(
                "gpubake: no recipe given, using the built-in default recipes/{DEFAULT_RECIPE}"
            );
            Ok(LoadedRecipe::builtin_default())
        }
    }
}

/// Writes `text` to `path` atomically, or to standard output.
fn emit(path: Option<&Path>, text: &str) -> Result<()> {
    match path {
        Some(p) => crate::fsutil::write_atomic(p, text.as_bytes()),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .map_err(|e| Error::io("<stdout>", e))
        }
    }
}

fn presets(action: PresetAction, json: bool, dirs: &[PathBuf]) -> Result<i32> {
    let catalog = Catalog::from_env(dirs);
    let here = Location {
        file: "command line".into(),
        line: None,
        column: None,
    };
    let merged = |name: &str| -> Result<MergedEnv> {
        let layers = catalog.layers(&[(name.to_string(), here.clone())], None)?;
        Ok(MergedEnv::from_layers(&layers))
    };
    match action {
        PresetAction::List => {
            #[derive(serde::Serialize)]
            struct Row {
                name: String,
                description: String,
                extends: Vec<String>,
                requires_nccl: Option<String>,
                debug: bool,
                file: String,
            }
            let mut rows = Vec::new();
            for name in catalog.names() {
                let p = catalog.load(&name, &here, None)?;
                rows.push(Row {
                    name,
                    requires_nccl: p.file.requires.nccl.as_ref().map(ToString::to_string),
                    debug: p.file.debug,
                    file: p.doc.name().to_string(),
                    description: p.file.description,
                    extends: p.file.extends,
                });
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).expect("rows serialize")
                );
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
        }
        PresetAction::Show { name } => {
            let env = merged(&name)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&env).expect("env serializes")
                );
            } else {
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
        }
        PresetAction::Diff { a, b } => {
            let (ea, eb) = (merged(&a)?, merged(&b)?);
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
                    a.clone(): va.map(|v| serde_json::json!({"value": v.value, "from": v.origin.by})),
                    b.clone(): vb.map(|v| serde_json::json!({"value": v.value, "from": v.origin.by})),
                }));
                if !json {
                    let show = |v: Option<&crate::preset::MergedVar>| match v {
                        Some(v) => format!("{} ({})", v.value, v.origin.by),
                        None => "(unset)".to_string(),
                    };
                    println!("{var}\n    {a}: {}\n    {b}: {}", show(va), show(vb));
                }
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).expect("rows serialize")
                );
            } else if rows.is_empty() {
                println!("{a} and {b} set the same values");
            }
        }
    }
    Ok(0)
}

/// Prints an error the way every command does, and returns its exit code.
pub fn report_error(err: &Error) -> i32 {
    eprintln!("error: {err}");
    err.exit_code()
}
