//! The README, docs/ and every `--help` agree with behaviour: every documented example is run
//! and must end as documented, with the exit code the documentation gives and the output it
//! shows (allowing its `…`/`...` elisions and measured figures such as times and digests).
//!
//! Every example is listed in [`EXAMPLES`] with how it is run: as written, on a stand-in
//! (with each substitution and the reason spelled out), or by another test that is named. An
//! example added to a markdown file or a help text without an entry there fails
//! `every_documented_example_is_accounted_for`, and so does an entry whose example is gone.
//!
//! The examples run in a shell, as a reader would type them, in a scratch workspace holding
//! copies of `recipes/`, `env-presets/` and `examples/`, with this build's binary first on
//! PATH. Those that need an image share one Debian base (`scripts/make-debian-base`, made
//! once per target directory) and the test wheel cache.
//!
//! To document a new command: add its example to the README or its help, then an entry to
//! [`EXAMPLES`] with the stage it needs (a new kind of environment, say a registry for
//! `docker://`, is a new [`Stage`] with its own test that starts it), the exit code the
//! documentation gives, and `How::AsWritten` where it can run here. Files the example reads
//! are best shown in the documentation with `$ cat FILE`, which defines them here too. The
//! command lines of the launcher and CI files under examples/ are parsed, not run.

mod common;

use clap::{CommandFactory, Parser};
use common::stack::wheel_cache;
use gpubake::cmd::Cli;
use regex::Regex;
use std::path::{Path, PathBuf};
use std::process::Command;

// ----------------------------------------------------------------------------------------
// What the documentation shows.

/// One documented example: a command after a `$ ` prompt in a markdown code block, or after
/// `Example: ` in a subcommand's help, with the output the documentation shows under it.
#[derive(Clone, Debug)]
struct Documented {
    /// Where it is written: `README.md:61` or `gpubake build --help`.
    place: String,
    /// The command line, as written.
    command: String,
    /// The lines shown under the command (none for help examples).
    output: Vec<String>,
}

/// The markdown files whose examples are held to behaviour.
fn markdown_files() -> Vec<PathBuf> {
    let root = common::root();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "examples"] {
        for entry in walkdir::WalkDir::new(root.join(dir)).sort_by_file_name() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy();
            let wanted = if dir == "docs" {
                name.ends_with(".md")
            } else {
                name == "README.md"
            };
            if wanted && entry.file_type().is_file() {
                files.push(entry.into_path());
            }
        }
    }
    files
}

/// The `$ ` commands of a markdown file's code blocks, each with the lines under it up to
/// the next prompt or the end of the block.
fn markdown_examples(path: &Path) -> Vec<Documented> {
    let text = std::fs::read_to_string(path).unwrap();
    let name = path
        .strip_prefix(common::root())
        .unwrap()
        .display()
        .to_string();
    let mut out: Vec<Documented> = Vec::new();
    let mut in_block = false;
    let mut open = false; // the last example still takes output lines
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            open = false;
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            out.push(Documented {
                place: format!("{name}:{}", i + 1),
                command: command.trim_end().to_string(),
                output: Vec::new(),
            });
            open = true;
        } else if open {
            out.last_mut().unwrap().output.push(line.to_string());
        }
    }
    out
}

/// Every `Example: ` of every subcommand's help, whole (a line may chain commands with `&&`).
fn help_examples() -> Vec<Documented> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    for sub in cmd.get_subcommands_mut().filter(|s| !s.is_hide_set()) {
        let name = sub.get_name().to_string();
        let help = sub.render_long_help().to_string();
        for line in help.lines() {
            if let Some(example) = line.trim().strip_prefix("Example: ") {
                out.push(Documented {
                    place: format!("gpubake {name} --help"),
                    command: example.to_string(),
                    output: Vec::new(),
                });
            }
        }
    }
    out
}

/// Every documented example, markdown files first, in the order written.
fn documented() -> Vec<Documented> {
    markdown_files()
        .iter()
        .flat_map(|f| markdown_examples(f))
        .chain(help_examples())
        .collect()
}

// ----------------------------------------------------------------------------------------
// How each example is run.

/// Which test runs an example, by what it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Nothing but the binary and the repository's files.
    Offline,
    /// uv and PyPI: the Python closure is resolved (metadata only, no wheel is fetched).
    Closure,
    /// The Debian base, the wheel cache and the Docker Engine.
    Image,
}

/// What of the documented output a run must show.
#[derive(Clone, Copy, Debug)]
enum Shows {
    /// Every line shown (with its elisions).
    All,
    /// The lines shown, except those whose first word is listed: layers the stand-in has
    /// none of.
    Without(&'static [&'static str]),
    /// The lines shown before this one; what follows it needs what the stand-in lacks.
    Before(&'static str),
}

#[derive(Clone, Copy, Debug)]
enum How {
    /// Run as written.
    AsWritten,
    /// `$ cat FILE`: the output shown is the file's content, written into the workspace
    /// before the examples run; then the command runs as written.
    DefinesFile(&'static str),
    /// Run with these substitutions (applied in order; `{pid}` is this process's id,
    /// `{gpubake}` the binary, `{wheel_cache}` the tests' wheel cache,
    /// `{base_tag}` the Debian base loaded into the engine).
    StandIn {
        replace: &'static [(&'static str, &'static str)],
        shows: Shows,
        why: &'static str,
    },
    /// Run by something other than this file.
    Elsewhere { by: &'static str, why: &'static str },
}

/// One documented example and how this file holds it to the documentation.
struct Example {
    /// The command exactly as documented (every place that documents it).
    command: &'static str,
    stage: Stage,
    /// The exit codes the documentation gives for it.
    exit: &'static [i32],
    how: How,
}

/// The lines of the build output that only a build with the PyTorch closure prints: its
/// layers, and the note on checking its wheels against the base's glibc.
const STACK_LAYERS: &[&str] = &[
    "note:",
    "venv",
    "torch",
    "nvidia-cudnn-cu12",
    "nvidia",
    "python",
    "extras",
];

const PREFLIGHT_WHY: &str = "the documented recipe's closure is 4.1 GB of PyTorch and CUDA \
    wheels, too much for CI, and a smaller closure is refused: `build` checks that the closure \
    holds every pin of the lock (torch and 16 nvidia-* wheels). The same command line runs with \
    --without-python added (a preflight image: base, probe, presets), and the lines of the \
    stack's layers are left out of the comparison; the stack itself is built from small real \
    wheels by tests/stack.rs (the_stack_installs_runs_and_reproduces_on_a_debian_base), and the \
    full build's output is recorded in benches/results/stack-debian-2026-11-30.txt";

/// Every documented example. A new example needs an entry here: run it, stand it in or
/// name what runs it.
const EXAMPLES: &[Example] = &[
    // README: the tour.
    Example {
        command: "gpubake resolve recipes/h100-pytorch2.9.yaml --explain",
        stage: Stage::Offline,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "cat team.yaml",
        stage: Stage::Offline,
        exit: &[0],
        how: How::DefinesFile("team.yaml"),
    },
    Example {
        command: "gpubake resolve team.yaml",
        stage: Stage::Offline,
        exit: &[2],
        how: How::AsWritten,
    },
    Example {
        command: "cat nccl.conf",
        stage: Stage::Offline,
        exit: &[0],
        how: How::DefinesFile("nccl.conf"),
    },
    Example {
        command: "gpubake lint env-presets/*.yaml recipes/*.yaml nccl.conf",
        stage: Stage::Offline,
        exit: &[1],
        how: How::AsWritten,
    },
    Example {
        command: "scripts/make-debian-base ./base",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "common::debian_base(), which runs this script once per target directory; \
                 the image examples' workspace links the result as ./base",
            why: "mmdebstrap takes minutes; every image test shares one base",
        },
    },
    Example {
        command: "gpubake resolve examples/debian-pytorch2.9.yaml -o examples/debian.lock",
        stage: Stage::Closure,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake build examples/debian-pytorch2.9.yaml --from oci:./base:bookworm \
                  --to oci:./out:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::StandIn {
            replace: &[(" --from ", " --without-python --from ")],
            shows: Shows::Without(STACK_LAYERS),
            why: PREFLIGHT_WHY,
        },
    },
    Example {
        command: "gpubake build examples/debian-pytorch2.9.yaml --from oci:./base:bookworm \
                  --to docker-daemon:train:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::StandIn {
            replace: &[
                (" --from ", " --without-python --from "),
                (
                    "docker-daemon:train:v1",
                    "docker-daemon:gpubake-docs-train:{pid}",
                ),
            ],
            shows: Shows::All,
            why: "as the OCI build above; the tag is made unique so that runs side by side \
                  do not meet, and is removed afterwards",
        },
    },
    Example {
        command: "docker run --rm train:v1 python3 -c \"import torch; print(torch.__version__, \
                  torch.cuda.nccl.version())\"",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/stack.rs (the_stack_installs_runs_and_reproduces_on_a_debian_base) runs \
                 the venv's python3 in a small-wheel image through the Docker Engine",
            why: "importing torch needs the 4.1 GB closure",
        },
    },
    Example {
        command: "docker run --rm train:v1 sh -c 'for c in python3 gpubake torchrun; do command -v \"$c\"; done'",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/stack.rs (the_stack_installs_runs_and_reproduces_on_a_debian_base) runs \
                 python3 from /opt/gpubake/venv, a console script and gpubake in a small-wheel \
                 image",
            why: "torchrun is torch's console script: it needs the 4.1 GB closure",
        },
    },
    Example {
        command: "gpubake verify oci:./out:v1          # re-hash every blob; labels, lock and \
                  nccl.conf agree",
        stage: Stage::Image,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake inspect oci:./out:v1         # pins, labels, layers, presets with \
                  provenance, env",
        stage: Stage::Image,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake certify oci:.device/image:h200 --runtime crun --cdi-spec-dir \
                  /tmp/run/certify/cdi --out certify-crun.json --junit certify-crun.xml",
        stage: Stage::Image,
        exit: &[3],
        how: How::StandIn {
            replace: &[("/tmp/run/certify/cdi", "cdi")],
            shows: Shows::Before("# cdi"),
            why: "the report shown was made on two H200s (benches/h200-certify.sh; \
                  recorded_outputs_are_quoted_verbatim holds the README to its raw file). \
                  Here the image is the same kind, a preflight image of an H200 recipe \
                  built on the Debian base, and the CDI directory is an empty one in the \
                  workspace: no GPU, so exit 3 as documented, after the static checks, whose \
                  lines must be the documented ones",
        },
    },
    // The help texts.
    Example {
        command: "gpubake resolve recipes/h100-pytorch2.9.yaml -o gpubake.lock --driver \
                  550.54.15",
        stage: Stage::Closure,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake lint recipes/*.yaml env-presets/*.yaml /etc/nccl.conf",
        stage: Stage::Offline,
        exit: &[1],
        how: How::StandIn {
            replace: &[("/etc/nccl.conf", "nccl.conf")],
            shows: Shows::All,
            why: "/etc/nccl.conf is the host's, which CI does not have: the README's \
                  nccl.conf stands in, so the errors in it make the exit 1",
        },
    },
    Example {
        command: "gpubake presets show nvlink; gpubake presets diff pcie nvlink",
        stage: Stage::Offline,
        exit: &[1], // the presets differ: diff(1)'s 1, as the help says
        how: How::AsWritten,
    },
    Example {
        command: "gpubake render recipes/h100-pytorch2.9.yaml --context ctx && docker build ctx",
        stage: Stage::Image,
        exit: &[0],
        how: How::StandIn {
            replace: &[
                ("recipes/h100-pytorch2.9.yaml", "h100-on-debian.yaml"),
                (" --context ", " --without-python --context "),
                (
                    "docker build ctx",
                    "docker build -q -t gpubake-docs-render:{pid} ctx",
                ),
            ],
            shows: Shows::All,
            why: "the recipe's base (nvidia/cuda) cannot be pulled in CI and its closure is \
                  4.1 GB: the stand-in is the same recipe on the Debian base loaded into the \
                  engine, rendered without the Python stack (tests/stack.rs builds a \
                  small-wheel context with the engine and compares the trees); the image is \
                  tagged so that it can be removed",
        },
    },
    Example {
        command: "gpubake build recipes/h100-pytorch2.9.yaml --from oci:./base:latest --to \
                  oci:./out:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::StandIn {
            replace: &[
                (" --from ", " --without-python --from "),
                ("oci:./base:latest", "oci:./base:bookworm"),
            ],
            shows: Shows::All,
            why: PREFLIGHT_WHY,
        },
    },
    Example {
        command: "gpubake build examples/debian-pytorch2.9.yaml --from oci:./base:bookworm \
                  --to oci:./out:v1 --sbom out.spdx.json",
        stage: Stage::Image,
        exit: &[0],
        how: How::StandIn {
            replace: &[(" --from ", " --without-python --from ")],
            shows: Shows::All,
            why: PREFLIGHT_WHY,
        },
    },
    Example {
        command: "gpubake build examples/debian-pytorch2.9.yaml --from oci:./base:bookworm \
                  --to oci:./out:v1 --sbom out.cdx.json --sbom-format cyclonedx",
        stage: Stage::Image,
        exit: &[0],
        how: How::StandIn {
            replace: &[(" --from ", " --without-python --from ")],
            shows: Shows::All,
            why: PREFLIGHT_WHY,
        },
    },
    Example {
        command: "gpubake install pylock.train.toml --wheels /ctx/cache --root /stack --python-root /",
        stage: Stage::Image,
        exit: &[0],
        how: How::StandIn {
            replace: &[(
                "gpubake install",
                "docker run --rm -v \"$PWD/pylock.train.toml:/pylock.train.toml:ro\" \
                 -v {wheel_cache}:/ctx/cache -v {gpubake}:/usr/local/bin/gpubake:ro \
                 -w / {base_tag} gpubake install",
            )],
            shows: Shows::All,
            why: "install runs in a build stage, on the image's filesystem: here in a \
                  container of the Debian base, with the small-wheel closure \
                  (tests/fixtures/pylock.small.toml) as pylock.train.toml and its wheels in \
                  the tests' wheel cache, mounted at /ctx/cache",
        },
    },
    Example {
        command: "gpubake inspect oci:./out:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake inspect --libraries oci:./out:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake verify oci:./out:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake gc oci:./out --dry-run",
        stage: Stage::Image,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake gc --cache",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/crash.rs runs `gc --cache` (gc_of_the_cache_removes_leftovers_and_orphans_and_keeps_every_recorded_layer, gc_waits_for_a_live_build_and_removes_nothing_it_writes)",
            why: "here it would collect the tests' shared cache, which other tests build \
                  from at the same time",
        },
    },
    Example {
        command: "gpubake certify oci:./out:v1 --gpus none",
        stage: Stage::Image,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake certify oci:./out:v1 --gpus all --out cert.json --junit cert.xml",
        stage: Stage::Image,
        // 3 where the engine has no GPU runtime (the static checks still run and both files
        // are written), 0 where it has one.
        exit: &[0, 3],
        how: How::AsWritten,
    },
    Example {
        command: "docker run --rm --gpus all IMAGE gpubake probe --junit /out/probe.xml",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/probe.rs (reports_are_written_even_without_a_gpu) runs `gpubake probe \
                 --junit`; on one H200, without the container, it exited 0 and wrote the \
                 JUnit file (benches/results/probe-help-example-h200-2026-11-30.txt)",
            why: "it needs a GPU and an engine with the NVIDIA runtime",
        },
    },
    Example {
        command: "gpubake probe --level 1 --emit prometheus:/var/lib/node_exporter/gpubake.prom",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/emit.rs (a_probe_without_a_gpu_still_writes_both_files_whole) runs \
                 `gpubake probe --level 1 --emit prometheus:FILE --emit nfd:FILE` and checks \
                 the file with promtool; on one H200 level 1 exited 0 \
                 (benches/results/levels-short-h200-2026-12-03.txt)",
            why: "it needs a GPU, and node_exporter's textfile directory on the node",
        },
    },
    Example {
        // No NVIDIA driver here: not judged (3); the JUnit file is written all the same.
        command: "gpubake preflight --junit preflight.xml",
        stage: Stage::Offline,
        exit: &[0, 1, 3],
        how: How::AsWritten,
    },
    Example {
        command: "docker run --rm -v /:/host:ro IMAGE gpubake preflight --root /host",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/preflight.rs runs `gpubake preflight --root` on recorded host trees, \
                 and on this machine's own root against `docker info`",
            why: "it needs a GPU node's host mounted into an image that holds gpubake",
        },
    },
    Example {
        command: "srun --ntasks-per-node=1 --kill-on-bad-exit=0 gpubake probe --world",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/world.rs runs `gpubake probe --world` as real ranks on 127.0.0.1 \
                 (rank_zero_aggregates_every_rank, with torchrun's variables) and reads \
                 srun's (launcher_variables_that_do_not_add_up_are_exit_2_naming_them)",
            why: "it needs Slurm and a GPU per node",
        },
    },
    Example {
        command: "gpubake build recipe.yaml --compression estargz --to docker://registry.example.com/team/train:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/image.rs builds with --compression estargz into a layout and reads it \
                 back with umoci and verify (an_estargz_image_unpacks_as_gzip_and_verify_checks_its_tocs); \
                 tests/estargz.rs reads the layers with the stargz snapshotter's own library",
            why: "registry.example.com stands for the reader's registry; a push is the same for \
                  every compression (tests/registry.rs)",
        },
    },
    Example {
        command: "gpubake probe --python /opt/gpubake/venv/bin/python3 --record-startup startup.json",
        stage: Stage::Image,
        exit: &[0, 1, 3],
        how: How::Elsewhere {
            by: "tests/probe.rs records a stand-in torch's import with --python and \
                 --record-startup (the_startup_record_holds_what_the_import_read_in_order); \
                 benches/h200-startup.sh records torch 2.11 on a GPU and sets the record beside \
                 the kernel's page cache",
            why: "it needs the image's venv with torch, and a GPU for more than the import",
        },
    },
    Example {
        command: "gpubake build recipe.yaml --compression estargz --startup-record startup.json --to docker://registry.example.com/team/train:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/stack.rs builds a real stack with a start-up record and reads each layer \
                 back with the snapshotter's own reader and inspect \
                 (a_startup_record_lays_out_the_estargz_stack_layers); tests/cli.rs runs the \
                 flag's refusals (a_startup_record_that_cannot_order_the_layers_is_refused_first)",
            why: "registry.example.com stands for the reader's registry, and the record must be \
                  one of the recipe's torch",
        },
    },
    Example {
        command: "gpubake copy --compression estargz docker://registry.example.com/team/train:v1 docker://registry.example.com/team/train:v1-estargz",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/estargz.rs copies a gzip image with --compression estargz and reads every \
                 layer back with the snapshotter's own reader, verify and umoci \
                 (copy_rewrites_a_gzip_image_as_estargz); tests/platforms.rs copies an index \
                 (an_index_copied_as_estargz_keeps_its_platforms)",
            why: "registry.example.com stands for the reader's registry; a copy to or from one \
                  is tests/registry.rs's",
        },
    },
    Example {
        command: "gpubake build recipe.yaml --to docker://registry.example.com/team/train:main --cache-from docker://registry.example.com/team/train-cache:main --cache-to docker://registry.example.com/team/train-cache:main --timings",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/registry.rs records a build with --cache-to and builds it again on \
                 runners with empty caches with --cache-from, each layer from the registry \
                 and the same digest (a_fresh_runner_builds_from_the_registrys_layer_cache), \
                 and names bad records (a_cache_record_that_is_not_what_it_says_is_named_and_its_layer_built); \
                 tests/stack.rs does it for the Python stack with no wheel fetched \
                 (a_fresh_runner_takes_the_stack_from_the_registry_cache_fetching_no_wheel)",
            why: "registry.example.com stands for the reader's registry; the tests push to \
                  a registry of their own on 127.0.0.1",
        },
    },
    // Registries: each test of tests/registry.rs starts its own registry (TLS, logins).
    Example {
        command: "gpubake build examples/debian-pytorch2.9.yaml --from docker://registry.example.com/base/bookworm:1 --to docker://registry.example.com/team/train:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/registry.rs runs `build --from docker://… --to docker://…` against its own registry (a_registry_image_serves_as_the_base, a_build_pushed_to_a_registry_has_the_digest_of_the_same_build_in_a_layout)",
            why: "registry.example.com stands for the reader's registry; the tests push to \
                  a registry of their own on 127.0.0.1",
        },
    },
    Example {
        command: "gpubake build multi.yaml --without-python --from oci:./base:multi \
                  --to oci:./multi:v1 --probe-binary linux/arm64=./gpubake-aarch64",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/platforms.rs \
                 (a_two_platform_recipe_builds_an_index_that_skopeo_umoci_and_gpubake_read) \
                 builds a two-platform recipe on a two-platform base with an aarch64 probe",
            why: "the example needs a base index with an arm64 image and a gpubake built for \
                  aarch64, which that test makes (a small aarch64 program stands for the probe)",
        },
    },
    Example {
        command: "gpubake inspect oci:./multi:v1 --platform linux/arm64",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/platforms.rs \
                 (a_two_platform_recipe_builds_an_index_that_skopeo_umoci_and_gpubake_read) \
                 inspects and verifies each platform of the index it built",
            why: "it reads the index the build example above makes",
        },
    },
    Example {
        command: "gpubake copy docker://registry.example.com/team/train:v1 oci:./mirror:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/registry.rs runs `copy docker://… oci:…` (copy_round_trips_through_a_registry)",
            why: "registry.example.com stands for the reader's registry; the tests push to \
                  a registry of their own on 127.0.0.1",
        },
    },
    Example {
        command: "gpubake verify docker://registry.example.com/team/train:v1 --cert-dir /etc/pki/registry",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/registry.rs runs `verify docker://… --cert-dir` (a_build_pushed_to_a_registry_has_the_digest_of_the_same_build_in_a_layout)",
            why: "registry.example.com stands for the reader's registry; the tests push to \
                  a registry of their own on 127.0.0.1",
        },
    },
    Example {
        command: "gpubake build examples/debian-pytorch2.9.yaml --from oci:./base:bookworm --to docker://registry.example.com/team/train:v1 --sbom train.spdx.json",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/registry.rs runs `build --to docker://… --sbom FILE` (build_sbom_is_written_and_attached_to_the_pushed_image)",
            why: "registry.example.com stands for the reader's registry; the tests push to \
                  a registry of their own on 127.0.0.1",
        },
    },
    Example {
        command: "gpubake certify docker://registry.example.com/team/train:v1 --gpus all --attach --key cosign.key",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/registry.rs runs `certify docker://… --attach --key` (a_certificate_attached_as_a_referrer_is_found_by_the_tag_schema, with --gpus none: no GPU here)",
            why: "registry.example.com stands for the reader's registry; the tests push to \
                  a registry of their own on 127.0.0.1",
        },
    },
    Example {
        command: "gpubake verify docker://registry.example.com/team/train:v1 --certified --key cosign.pub",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/registry.rs runs `verify docker://… --certified --key` (a_certificate_attached_as_a_referrer_is_found_by_the_tag_schema, a_certificate_is_believed_only_signed_with_the_key_for_this_digest_and_passing)",
            why: "registry.example.com stands for the reader's registry; the tests push to \
                  a registry of their own on 127.0.0.1",
        },
    },
    Example {
        command: "gpubake copy oci:./out:v1 docker://registry.example.com/team/train:v1",
        stage: Stage::Image,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/registry.rs runs `copy oci:… docker://…` (copy_round_trips_through_a_registry)",
            why: "registry.example.com stands for the reader's registry; the tests push to \
                  a registry of their own on 127.0.0.1",
        },
    },
    Example {
        command: "gpubake key generate --output-prefix cosign && gpubake key public cosign.key",
        stage: Stage::Offline,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake compat --release 2.9",
        stage: Stage::Offline,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake completions bash",
        stage: Stage::Offline,
        exit: &[0],
        how: How::AsWritten,
    },
    Example {
        command: "gpubake man ~/.local/share/man/man1 && man gpubake-certify",
        stage: Stage::Offline,
        exit: &[0],
        how: How::Elsewhere {
            by: "tests/shell.rs, which writes every page and renders each with groff",
            why: "it writes into the user's home, and man is not everywhere",
        },
    },
];

/// The entry of a documented command.
fn entry(command: &str) -> Option<&'static Example> {
    EXAMPLES.iter().find(|e| e.command == command)
}

#[test]
fn every_documented_example_is_accounted_for() {
    let docs = documented();
    assert!(docs.len() >= 20, "{docs:?}");
    let missing: Vec<String> = docs
        .iter()
        .filter(|d| entry(&d.command).is_none())
        .map(|d| format!("{}: {}", d.place, d.command))
        .collect();
    assert!(
        missing.is_empty(),
        "documented examples that tests/docs.rs neither runs nor maps (add them to EXAMPLES):\n{}",
        missing.join("\n")
    );
    let stale: Vec<&str> = EXAMPLES
        .iter()
        .filter(|e| !docs.iter().any(|d| d.command == e.command))
        .map(|e| e.command)
        .collect();
    assert!(
        stale.is_empty(),
        "EXAMPLES lists commands no documentation shows any more:\n{}",
        stale.join("\n")
    );
    for e in EXAMPLES {
        // Each way other than as written says why, where the output of the test shows it.
        match e.how {
            How::StandIn { why, .. } => eprintln!("stand-in: {}\n    why: {why}", e.command),
            How::Elsewhere { by, why } => {
                assert!(!by.is_empty() && !why.is_empty(), "{}", e.command);
                eprintln!("elsewhere: {}\n    by: {by}\n    why: {why}", e.command);
            }
            How::AsWritten | How::DefinesFile(_) => {}
        }
        // A stand-in that substitutes nothing, or leaves out lines no documentation shows,
        // is a mistake in this table.
        if let How::StandIn { replace, shows, .. } = e.how {
            for (from, _) in replace {
                assert!(e.command.contains(from), "{}: no `{from}`", e.command);
            }
            let shown: Vec<String> = docs
                .iter()
                .filter(|d| d.command == e.command)
                .flat_map(|d| d.output.clone())
                .collect();
            match shows {
                Shows::All => {}
                Shows::Without(words) => {
                    for w in words {
                        assert!(
                            shown.iter().any(|l| first_word(l) == *w),
                            "{}: no documented line starts with {w}",
                            e.command
                        );
                    }
                }
                Shows::Before(line) => assert!(
                    shown.iter().any(|l| l.trim() == line),
                    "{}: no documented line {line}",
                    e.command
                ),
            }
        }
    }
}

/// The `gpubake` command lines of the launcher and CI files under examples/ (GitHub Actions,
/// GitLab CI, Slurm, torchrun, Kubernetes): they run on machines this test has not, so they
/// are parsed, not run. A YAML `command: [...]` list is read as its words; CI variables
/// (`${{ github.sha }}`, `$IMAGE_TAR`) stand for one word.
fn example_file_commands() -> Vec<Documented> {
    let root = common::root();
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(root.join("examples")).sort_by_file_name() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !entry.file_type().is_file()
            || !["yml", "yaml", "sh", "sbatch"]
                .iter()
                .any(|ext| name.ends_with(&format!(".{ext}")))
        {
            continue;
        }
        let rel = entry
            .path()
            .strip_prefix(&root)
            .unwrap()
            .display()
            .to_string();
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for (i, line) in text.lines().enumerate() {
            let line = line.replace("${{ github.sha }}", "X");
            let command = match line.split_once("command: [") {
                Some((_, list)) => {
                    let list = format!("[{}", list.split_once(']').map_or(list, |(l, _)| l));
                    let words: Vec<String> = serde_json::from_str(&format!("{list}]")).unwrap();
                    words.join(" ")
                }
                None => line
                    .trim()
                    .trim_start_matches("- ")
                    .trim_start_matches("run: ")
                    .to_string(),
            };
            if words(&command).iter().any(|w| w == "gpubake") {
                out.push(Documented {
                    place: format!("{rel}:{}", i + 1),
                    command,
                    output: Vec::new(),
                });
            }
        }
    }
    out
}

/// Each `gpubake` command of each example, and of the files under examples/, is accepted by
/// the parser as written.
#[test]
fn every_documented_command_line_is_accepted_as_written() {
    let mut refused = Vec::new();
    let mut parsed = 0;
    let subcommands: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let from_files = example_file_commands();
    assert!(from_files.len() >= 10, "{from_files:?}");
    for d in documented().into_iter().chain(from_files) {
        for part in d.command.split("&&").flat_map(|p| p.split(';')) {
            let words = words(part);
            // `gpubake` as the command, not in prose (`Install gpubake (vendored …)`).
            let Some(at) = words.iter().position(|w| w == "gpubake") else {
                continue;
            };
            let Some(next) = words.get(at + 1) else {
                continue;
            };
            if !next.starts_with('-') && !subcommands.contains(next) {
                continue;
            }
            parsed += 1;
            if let Err(e) = Cli::try_parse_from(&words[at..]) {
                refused.push(format!(
                    "{}: {part}\n    {}",
                    d.place,
                    e.to_string().lines().next().unwrap_or("")
                ));
            }
        }
    }
    assert!(parsed >= 20, "{parsed}");
    assert!(
        refused.is_empty(),
        "documented commands the CLI refuses:\n{}",
        refused.join("\n")
    );
}

// ----------------------------------------------------------------------------------------
// Running them.

/// A scratch directory laid out as the repository's root, with this build's binary first on
/// PATH.
struct Workspace {
    dir: tempfile::TempDir,
    /// Values for the `{…}` placeholders of stand-ins.
    values: Vec<(&'static str, String)>,
}

impl Workspace {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = common::root();
        for sub in ["recipes", "env-presets", "examples"] {
            copy_tree(&root.join(sub), &dir.path().join(sub));
        }
        let bin = dir.path().join(".bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gpubake"), bin.join("gpubake")).unwrap();
        // The files the documentation shows with `$ cat`.
        for d in documented() {
            if let Some(Example {
                how: How::DefinesFile(name),
                ..
            }) = entry(&d.command)
            {
                std::fs::write(dir.path().join(name), d.output.join("\n") + "\n").unwrap();
            }
        }
        Workspace {
            dir,
            values: vec![
                ("{pid}", std::process::id().to_string()),
                ("{gpubake}", env!("CARGO_BIN_EXE_gpubake").to_string()),
                ("{wheel_cache}", wheel_cache().display().to_string()),
            ],
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs a command line with bash in the workspace, standard error merged into standard
    /// output as a terminal shows them; returns the exit code and the lines.
    /// The workspace's gpubake cache: the tests' shared wheels, and a layer cache of its own,
    /// as a reader's first build on a fresh machine has none.
    fn cache(&self) -> PathBuf {
        let cache = self.path().join(".cache");
        if !cache.exists() {
            std::fs::create_dir_all(&cache).unwrap();
            let wheels = wheel_cache().join("wheels");
            std::fs::create_dir_all(&wheels).unwrap();
            std::os::unix::fs::symlink(&wheels, cache.join("wheels")).unwrap();
        }
        cache
    }

    fn sh(&self, line: &str) -> (i32, Vec<String>) {
        let path = format!(
            "{}:{}",
            self.path().join(".bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("exec 2>&1\n{line}"))
            .current_dir(self.path())
            .env("PATH", path)
            .env_remove("GPUBAKE_PRESET_PATH")
            .env_remove("SOURCE_DATE_EPOCH")
            .env("GPUBAKE_CACHE_DIR", self.cache())
            // The documented outputs leave out the progress lines a slow step prints in a log
            // (a terminal's bar clears itself); the stand-ins are slower than the real thing.
            .env("GPUBAKE_PROGRESS_SECONDS", "3600")
            .output()
            .expect("bash runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code().unwrap_or(-1),
            text.lines().map(str::to_string).collect(),
        )
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.unwrap();
        let dest = to.join(entry.path().strip_prefix(from).unwrap());
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
        } else {
            std::fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

/// Runs every documented example of `stage` in documented order, each as its entry says, and
/// returns what failed to end as documented.
fn run_stage(stage: Stage, ws: &Workspace) -> Vec<String> {
    let mut failures = Vec::new();
    let mut manifests: Vec<(String, String)> = Vec::new();
    for d in documented() {
        let e = entry(&d.command).expect("accounted for");
        if e.stage != stage {
            continue;
        }
        let (line, shows) = match e.how {
            How::Elsewhere { .. } => continue,
            How::AsWritten | How::DefinesFile(_) => (d.command.clone(), Shows::All),
            How::StandIn { replace, shows, .. } => {
                let mut line = d.command.clone();
                for (from, to) in replace {
                    let mut to = to.to_string();
                    for (key, value) in &ws.values {
                        to = to.replace(key, value);
                    }
                    line = line.replace(from, &to);
                }
                (line, shows)
            }
        };
        let (code, lines) = ws.sh(&line);
        eprintln!("{}: exit {code}: {line}", d.place);
        let shown: Vec<String> = match shows {
            Shows::All => d.output.clone(),
            Shows::Without(words) => d
                .output
                .iter()
                .filter(|l| !words.contains(&first_word(l)))
                .cloned()
                .collect(),
            Shows::Before(stop) => d
                .output
                .iter()
                .take_while(|l| l.trim() != stop)
                .cloned()
                .chain(["…".to_string()])
                .collect(),
        };
        let figures = matches!(e.how, How::StandIn { .. });
        let mut problems = Vec::new();
        if !e.exit.contains(&code) {
            problems.push(format!("exit {code}, documented {:?}", e.exit));
        }
        if lines.iter().any(|l| l.contains("panicked")) {
            problems.push("it panicked".into());
        }
        if !d.output.is_empty() && !output_matches(&shown, &lines, figures) {
            problems.push(format!(
                "the output is not the documented one\n--- documented\n{}\n--- printed",
                shown.join("\n")
            ));
        }
        // Files the command says it writes exist afterwards.
        let words = words(&line);
        for pair in words.windows(2) {
            if ["-o", "--out", "--junit", "--sbom"].contains(&pair[0].as_str())
                && !ws.path().join(&pair[1]).exists()
            {
                problems.push(format!("{} {} was not written", pair[0], pair[1]));
            }
        }
        // The same build again gives the same manifest, every layer reused.
        if let Some(manifest) = lines
            .iter()
            .find_map(|l| l.trim().strip_prefix("manifest "))
        {
            if let Some((_, before)) = manifests.iter().find(|(c, _)| *c == line) {
                if before != manifest {
                    problems.push(format!("the manifest changed: {before} then {manifest}"));
                }
                if let Some(l) = lines
                    .iter()
                    .filter(|l| l.trim().starts_with(|c: char| c.is_ascii_lowercase()))
                    .filter(|l| l.contains("sha256:") && !l.contains("manifest"))
                    .find(|l| !l.trim_end().ends_with("reused"))
                {
                    problems.push(format!("a layer was written again: {l}"));
                }
            }
            manifests.push((line.clone(), manifest.to_string()));
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{}: {}\n  ran: {line}\n  {}\n{}",
                d.place,
                d.command,
                problems.join("\n  "),
                lines.join("\n")
            ));
        }
    }
    failures
}

#[test]
fn the_offline_examples_run_as_documented() {
    let ws = Workspace::new();
    let failures = run_stage(Stage::Offline, &ws);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `resolve -o` resolves the closure with uv against PyPI: metadata only, no wheel.
#[test]
fn the_closure_examples_run_as_documented() {
    if !common::have("uv", "--version") {
        return;
    }
    let ws = Workspace::new();
    let failures = run_stage(Stage::Closure, &ws);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The image examples on the Debian base: builds, verify, inspect, certify, install and
/// render with the engine.
#[test]
fn the_image_examples_run_as_documented() {
    let Some(base) = common::debian_base() else {
        return;
    };
    if !common::tools() || !common::have("docker", "info") {
        return;
    }
    let mut ws = Workspace::new();
    std::os::unix::fs::symlink(&base, ws.path().join("base")).unwrap();
    // The engine's copy of the base, for the stand-ins that run in a container or build
    // with the engine.
    let base_tag = format!("gpubake-docs-debian:{}", std::process::id());
    common::stack::base_into_engine(&base, &base_tag);
    ws.values.push(("{base_tag}", base_tag.clone()));
    // The install stand-in: the small closure, its wheels in a wheel cache laid out as
    // `render --context` lays it out.
    let small = common::root().join("tests/fixtures/pylock.small.toml");
    std::fs::copy(&small, ws.path().join("pylock.train.toml")).unwrap();
    let closure =
        gpubake::closure::parse(&small, &std::fs::read_to_string(&small).unwrap()).unwrap();
    gpubake::wheel::cache::WheelCache::open(wheel_cache())
        .unwrap()
        .fetch(&closure.wheels, &Default::default())
        .unwrap();
    // The render stand-in: the H100 recipe on the engine's Debian base.
    let h100 = std::fs::read_to_string(ws.path().join("recipes/h100-pytorch2.9.yaml")).unwrap();
    let (before, after) = h100.split_once("\nbase: ").unwrap();
    let rest = after.split_once('\n').map_or("", |(_, r)| r);
    std::fs::write(
        ws.path().join("h100-on-debian.yaml"),
        format!("{before}\nbase: {base_tag}\n{rest}"),
    )
    .unwrap();
    // The certify stand-in: a preflight image of an H200 recipe, and no CDI spec.
    std::fs::create_dir(ws.path().join("cdi")).unwrap();
    std::fs::write(
        ws.path().join("h200-preflight.yaml"),
        "name: h200-preflight\nbase: debian:bookworm\npytorch: \"2.11\"\ngpus: [h200]\n\
         driver: \">=580\"\npresets: [base, nvlink]\n",
    )
    .unwrap();
    // In a cache of its own: the README's first build finds no layer cached.
    let (code, lines) = ws.sh(
        "GPUBAKE_CACHE_DIR=$PWD/.setup-cache gpubake build h200-preflight.yaml --without-python \
         --from oci:./base:bookworm --to oci:.device/image:h200",
    );
    assert_eq!(code, 0, "{}", lines.join("\n"));

    let failures = run_stage(Stage::Image, &ws);
    for tag in [
        format!("gpubake-docs-train:{}", std::process::id()),
        format!("gpubake-docs-render:{}", std::process::id()),
        base_tag,
    ] {
        let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ----------------------------------------------------------------------------------------
// Comparing output with what the documentation shows.

/// The first word of a documented output line.
fn first_word(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or("")
}

/// A documented output line as a pattern; None for a line that elides whole lines (`…` or
/// `...` alone). Within a line, `…`/`...` elide any text and a hex digest cut short with
/// `…` stands for the whole; times (`64.35 s`, `2.8 µs`) and full sha256 digests are measured,
/// so any value matches; with `figures` (stand-ins), so does every number and size unit.
/// Runs of spaces match any run of spaces. Text after three or more spaces in parentheses
/// at the end of a line is a comment on the output, not part of it.
fn line_pattern(doc: &str, figures: bool) -> Option<Regex> {
    static COMMENT: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"^(.*?\S)\s{3,}\([^()]*\)\s*$").unwrap());
    static TOKEN: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        Regex::new(
            r"(?x)
            (?P<digest>sha256:[0-9a-f]{64})
          | (?P<cut>[0-9a-f]{6,}(?:…|\.\.\.))
          | (?P<elide>…|\.\.\.)
          | (?P<time>\b\d+(?:\.\d+)?\ (?:s|µs)\b)
          | (?P<unit>\b(?:B|KB|MB|GB|TB)\b)
          | (?P<number>\d+(?:\.\d+)?)
          | (?P<space>\s+)",
        )
        .unwrap()
    });
    let text = match COMMENT.captures(doc) {
        Some(c) => c.get(1).unwrap().as_str(),
        None => doc,
    };
    if matches!(text.trim(), "…" | "...") {
        return None;
    }
    let mut pattern = String::from(r"^\s*");
    let mut at = 0;
    for c in TOKEN.captures_iter(text) {
        let whole = c.get(0).unwrap();
        pattern.push_str(&regex::escape(&text[at..whole.start()]));
        at = whole.end();
        let literal = regex::escape(whole.as_str());
        pattern.push_str(if c.name("digest").is_some() {
            "sha256:[0-9a-f]{64}"
        } else if c.name("cut").is_some() {
            "[0-9a-f]+"
        } else if c.name("elide").is_some() {
            ".*"
        } else if c.name("time").is_some() {
            r"[0-9.]+ (?:s|µs)"
        } else if c.name("unit").is_some() && figures {
            "(?:B|KB|MB|GB|TB)"
        } else if c.name("number").is_some() && figures {
            r"\d+(?:\.\d+)?"
        } else if c.name("space").is_some() {
            r"\s+"
        } else {
            &literal
        });
    }
    pattern.push_str(&regex::escape(&text[at..]));
    pattern.push_str(r"\s*$");
    Some(Regex::new(&pattern).unwrap())
}

/// The printed lines are the documented ones, in order, from the first to the last, where a
/// line of `…` stands for any number of lines. Blank lines are not compared.
fn output_matches(documented: &[String], printed: &[String], figures: bool) -> bool {
    fn from(pattern: &[Option<Regex>], lines: &[&str]) -> bool {
        match pattern.split_first() {
            None => lines.is_empty(),
            Some((None, rest)) => (0..=lines.len()).any(|skip| from(rest, &lines[skip..])),
            Some((Some(re), rest)) => {
                lines.first().is_some_and(|l| re.is_match(l)) && from(rest, &lines[1..])
            }
        }
    }
    let pattern: Vec<Option<Regex>> = documented
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| line_pattern(l, figures))
        .collect();
    let lines: Vec<&str> = printed
        .iter()
        .map(String::as_str)
        .filter(|l| !l.trim().is_empty())
        .collect();
    from(&pattern, &lines)
}

/// Outputs the README quotes from runs this file cannot repeat (two H200s, the 4.1 GB stack)
/// are the recorded ones under benches/results/: the certify report verbatim, and the build
/// lines with only the elisions the README marks.
#[test]
fn recorded_outputs_are_quoted_verbatim() {
    let docs = documented();
    let read = |name: &str| {
        std::fs::read_to_string(common::root().join("benches/results").join(name))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let certify = docs
        .iter()
        .find(|d| {
            d.command
                .starts_with("gpubake certify oci:.device/image:h200")
        })
        .unwrap();
    assert_eq!(
        certify.output,
        read("certify-crun-h200x2-2026-11-30.txt"),
        "README's certify report against its raw file"
    );

    // benches/tour.sh builds into ./A where the README writes ./out; notes and warnings are
    // compared as the README shows them, below.
    let raw = read("stack-debian-2026-12-02.txt");
    let section = |title: &str| -> Vec<String> {
        raw.iter()
            .skip_while(|l| *l != title)
            .skip(1)
            .take_while(|l| !l.starts_with("rc "))
            .filter(|l| !l.starts_with("note: ") && !l.starts_with("warning: "))
            .map(|l| l.replace("oci:./A:v1", "oci:./out:v1"))
            .collect()
    };
    let builds: Vec<&Documented> = docs
        .iter()
        .filter(|d| {
            d.command
                == "gpubake build examples/debian-pytorch2.9.yaml --from oci:./base:bookworm \
                    --to oci:./out:v1"
        })
        .collect();
    assert_eq!(builds.len(), 2);
    for (doc, title) in builds
        .iter()
        .zip(["== 1: fresh layout A", "== 2: layout A again"])
    {
        let shown: Vec<String> = doc
            .output
            .iter()
            .filter(|l| !l.starts_with("note: ") && !l.starts_with("warning: "))
            .cloned()
            .collect();
        let recorded = section(title);
        assert!(
            output_matches(&shown, &recorded, false),
            "README.md's build output against {title} of the raw file:\n{}\n---\n{}",
            shown.join("\n"),
            recorded.join("\n")
        );
    }
    // In the image the engine loaded: what `import torch` printed, stderr included (no
    // warning: the recipe has NumPy), and the commands on PATH.
    for (command, title) in [
        (
            "docker run --rm train:v1 python3 -c",
            "== docker run: import torch",
        ),
        ("docker run --rm train:v1 sh -c", "== docker run: commands"),
    ] {
        let doc = docs
            .iter()
            .find(|d| d.command.starts_with(command))
            .unwrap();
        assert_eq!(
            doc.output,
            section(title),
            "README's `{command}` against {title}"
        );
    }
    let resolve = docs
        .iter()
        .find(|d| {
            d.command
                .starts_with("gpubake resolve examples/debian-pytorch2.9.yaml")
        })
        .unwrap();
    let wrote = resolve.output.last().unwrap().replace("examples/", "");
    assert!(raw.contains(&wrote), "{wrote}");
}

#[test]
fn documented_output_allows_elisions_and_measured_figures_only() {
    let doc = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    let printed = doc(&[
        "built oci:./out:v1 in 3.20 s",
        "  manifest sha256:6d40903e582a20750c11c6e07a5e175805cf97cdf1ee145efda35a9ad0951620",
        "  base     sha256:4d1b90a92d61ce786d7cce0f77fc96c78829b3416f3d1d97fac903d7ab09b449   82.5 MB reused",
        "  probe    sha256:68f74d3e9ef4b81ed281da91551e541b4359a3a6bf87ec3cfe35eb1420da1c92    6.0 MB written",
    ]);
    let shown = doc(&[
        "built oci:./out:v1 in 64.35 s                       (every layer written)",
        "  manifest sha256:6d40903e…",
        "  …",
    ]);
    assert!(output_matches(&shown, &printed, false));
    // Another command, another size, a missing line, or a line too many: no match.
    let mut other = shown.clone();
    other[0] = "built oci:./out:v2 in 64.35 s".into();
    assert!(!output_matches(&other, &printed, false));
    let sizes = doc(&[
        "built oci:./out:v1 in 64.35 s",
        "…",
        "  probe    sha256:68f74d3e…    6.1 MB written",
    ]);
    assert!(!output_matches(&sizes, &printed, false));
    assert!(
        output_matches(&sizes, &printed, true),
        "a stand-in's figures"
    );
    assert!(
        !output_matches(&shown[..2], &printed, false),
        "unshown lines"
    );
    let mut longer = shown.clone();
    longer.push("  presets  sha256:1788a403…    2.1 KB written".into());
    assert!(
        !output_matches(&longer, &printed, true),
        "a line not printed"
    );
    // Counts are not figures unless a stand-in prints them.
    let lint = doc(&["12 files checked: 2 errors, 1 warning"]);
    assert!(!output_matches(
        &lint,
        &doc(&["12 files checked: 3 errors, 1 warning"]),
        false
    ));
}

/// A command line as a shell would split it (words, '…' and "…" quoting), without the
/// comment that may follow it.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (None, '#') if !started => break,
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (_, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

#[test]
fn shell_words_follow_quotes_and_drop_comments() {
    assert_eq!(
        words("gpubake verify oci:./out:v1   # re-hash"),
        ["gpubake", "verify", "oci:./out:v1"]
    );
    assert_eq!(words(r#"sh -c 'a b' "c d""#), ["sh", "-c", "a b", "c d"]);
}

// ----------------------------------------------------------------------------------------
// The README's command reference against the help.

/// The long flags (`--name`) each visible subcommand takes, from the parser the help is
/// printed from.
fn flags_by_command() -> Vec<(String, Vec<String>)> {
    fn walk(cmd: &clap::Command, flags: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            if let Some(long) = arg.get_long() {
                flags.push(format!("--{long}"));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, flags);
        }
    }
    let cmd = Cli::command();
    // Global flags (`--allow-files-outside`, `--preset-dir`) are every command's.
    let global: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| {
            let mut flags = vec!["--help".to_string()];
            flags.extend(global.iter().cloned());
            walk(s, &mut flags);
            (s.get_name().to_string(), flags)
        })
        .collect()
}

/// The README's and the guide's spans of code (`…`) outside code blocks that name gpubake's
/// flags: each with its file and line, the command it names (`build --engine-build …`,
/// `gpubake compat [--json]`) if any, and its flags. Spans that are another program's command line (docker, torchrun,
/// nvidia-ctk, cargo, a script) name that program's flags and are left out.
fn readme_flag_spans() -> Vec<(String, Option<String>, Vec<String>)> {
    let commands: Vec<String> = flags_by_command().into_iter().map(|(c, _)| c).collect();
    let mut out = Vec::new();
    for (name, text) in guide_texts() {
        spans_of(&name, &text, &commands, &mut out);
    }
    out
}

/// The README and the guide's pages (docs/guide/), each with its name.
fn guide_texts() -> Vec<(String, String)> {
    let root = common::root();
    let mut files = vec![root.join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs/guide"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    files.extend(pages);
    files
        .into_iter()
        .map(|f| {
            let name = f.strip_prefix(&root).unwrap().display().to_string();
            (name, std::fs::read_to_string(&f).unwrap())
        })
        .collect()
}

/// [`readme_flag_spans`] of one file.
fn spans_of(
    name: &str,
    text: &str,
    commands: &[String],
    out: &mut Vec<(String, Option<String>, Vec<String>)>,
) {
    static SPAN: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"`([^`]+)`").unwrap());
    static FLAG: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"(?:^|[\s\[(])(--[a-z][a-z0-9-]*)").unwrap());
    const OTHERS: &[&str] = &[
        "docker",
        "torchrun",
        "nvidia-ctk",
        "cargo",
        "skopeo",
        "python3",
        "srun",
        "mpirun",
        "umoci",
        "tar",
        "apt-get",
        "numactl",
        "dpkg",
        "dpkg-statoverride",
        "update-alternatives",
        "addgroup",
        "adduser",
    ];
    let mut line_no = 1;
    let mut in_block = false;
    for paragraph in text.split("\n\n") {
        let start = line_no;
        line_no += paragraph.lines().count() + 1;
        let was_in_block = in_block;
        if paragraph.lines().filter(|l| l.starts_with("```")).count() % 2 == 1 {
            in_block = !in_block;
        }
        if was_in_block || paragraph.starts_with("```") {
            continue;
        }
        for span in SPAN.captures_iter(paragraph) {
            let span = span[1].trim();
            let first = span.split_whitespace().next().unwrap_or("");
            // Another program, or a script of the repository (`scripts/refresh-compat`).
            if OTHERS.contains(&first) || first.contains('/') {
                continue;
            }
            let named = span
                .split_whitespace()
                .find(|w| *w != "gpubake")
                .filter(|w| commands.iter().any(|c| c == w))
                .map(str::to_string);
            let flags: Vec<String> = FLAG.captures_iter(span).map(|c| c[1].to_string()).collect();
            if !flags.is_empty() {
                out.push((format!("{name}:{start}"), named, flags));
            }
        }
    }
}

/// Every flag the README names is one the command its span names takes (some command where
/// the span names none), and the commands the README lists as working are exactly the
/// commands the binary has.
#[test]
fn the_readme_names_the_flags_and_commands_the_binary_has() {
    let by_command = flags_by_command();
    let takes = |command: &str, flag: &str| {
        by_command
            .iter()
            .any(|(c, flags)| c == command && flags.iter().any(|f| f == flag))
    };
    let mut wrong = Vec::new();
    let spans = readme_flag_spans();
    assert!(
        spans.iter().map(|(_, _, f)| f.len()).sum::<usize>() >= 20,
        "{spans:?}"
    );
    for (line, named, flags) in &spans {
        for flag in flags {
            let ok = match named {
                Some(c) => takes(c, flag),
                None => by_command.iter().any(|(c, _)| takes(c, flag)),
            };
            if !ok {
                wrong.push(format!(
                    "{line} (a paragraph): {flag} is not a flag of {}",
                    named.as_deref().unwrap_or("any command")
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // "Working: `resolve` (…), `lint`, …": the status list claims every command.
    let text = std::fs::read_to_string(common::root().join("README.md")).unwrap();
    let status = text
        .split_once("Working: ")
        .and_then(|(_, rest)| rest.split_once("Not built yet"))
        .expect("the README's status says what works")
        .0;
    let listed: std::collections::BTreeSet<String> = Regex::new(r"`([a-z]+)[` ]")
        .unwrap()
        .captures_iter(status)
        .map(|c| c[1].to_string())
        .collect();
    let have: std::collections::BTreeSet<String> =
        by_command.iter().map(|(c, _)| c.clone()).collect();
    assert_eq!(
        listed, have,
        "the README's status list against `gpubake --help`"
    );
    // "Every command has `--help` with an example."
    let with_example: std::collections::BTreeSet<String> = help_examples()
        .iter()
        .map(|d| {
            d.place
                .trim_start_matches("gpubake ")
                .trim_end_matches(" --help")
                .to_string()
        })
        .collect();
    assert_eq!(with_example, have, "commands whose help shows an example");
    // "`--json` gives machine-readable output (every command but `render`, `install` …)".
    let claim = Regex::new(r"--json` gives machine-readable output \(every command but ([^)]*)\)")
        .unwrap()
        .captures(&text)
        .expect("the README says which commands take --json");
    let named_without: std::collections::BTreeSet<String> = Regex::new(r"`(\w+)`")
        .unwrap()
        .captures_iter(&claim[1])
        .map(|c| c[1].to_string())
        .collect();
    let without_json: std::collections::BTreeSet<String> = by_command
        .iter()
        .filter(|(_, flags)| !flags.iter().any(|f| f == "--json"))
        .map(|(c, _)| c.clone())
        .collect();
    assert_eq!(without_json, named_without, "the commands without --json");
}

/// The tour's `sh -c` line prints one path per name under dash, the /bin/sh of Debian bases
/// (dash's `command -v` takes one name: `command -v a b c` prints only a's). Run here under
/// the host's /bin/sh with the three names on a PATH of stand-in programs.
#[test]
fn the_tours_command_v_line_prints_every_name_under_dash() {
    let guide: String = guide_texts().into_iter().map(|(_, t)| t).collect();
    let line = guide
        .lines()
        .find(|l| l.starts_with("$ docker run --rm train:v1 sh -c '"))
        .expect("the tour runs a shell line in the image");
    let script = line
        .split_once("sh -c '")
        .and_then(|(_, rest)| rest.strip_suffix('\''))
        .unwrap();
    let dash = Path::new("/bin/dash");
    if !dash.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs on Debian, which has dash"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let names = ["python3", "gpubake", "torchrun"];
    for name in names {
        let path = dir.path().join(name);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let out = Command::new(dash)
        .args(["-c", script])
        .env("PATH", dir.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let want: Vec<String> = names
        .iter()
        .map(|n| dir.path().join(n).display().to_string())
        .collect();
    assert_eq!(printed.lines().collect::<Vec<_>>(), want, "{script}");
    assert!(out.status.success());
}

/// The README's five-minute path is the guide's own: each of its lines is an example a guide
/// page shows and this file runs, word for word, so the short path cannot drift from the
/// tested one.
#[test]
fn the_readmes_five_minute_path_is_run_by_the_guide() {
    let readme = std::fs::read_to_string(common::root().join("README.md")).unwrap();
    let path = readme
        .split_once("## Five minutes")
        .and_then(|(_, rest)| rest.split_once("```sh\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the README shows a five-minute path")
        .0;
    let steps: Vec<&str> = path.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(steps.len() >= 4, "{steps:?}");
    let in_guide: Vec<Documented> = documented()
        .into_iter()
        .filter(|d| d.place.starts_with("docs/guide/"))
        .collect();
    for step in steps {
        let shown = in_guide.iter().find(|d| words(&d.command) == words(step));
        assert!(shown.is_some(), "`{step}` is no example of docs/guide/");
        assert!(entry(&shown.unwrap().command).is_some(), "{step}");
    }
}
