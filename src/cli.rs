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

/// How to reach registries (`docker://`), with skopeo's option names.
#[derive(clap::Args, Debug, Clone)]
struct RegistryArgs {
    /// Check registries' TLS certificates. --tls-verify=false accepts any certificate and,
    /// where HTTPS fails, tries plain HTTP, as skopeo does. Without the option, so it goes for
    /// a registry marked `insecure = true` in registries.conf or listed in docker's
    /// daemon.json `insecure-registries`, as skopeo and docker treat them; --tls-verify=true
    /// checks those too. A loopback registry is reached over plain HTTP when it speaks only
    /// that, as docker does. Credentials go over plain HTTP only to loopback or to a marked
    /// registry.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    tls_verify: Option<bool>,
    /// Trust the CA certificates (*.crt, PEM) in this directory as well.
    #[arg(long, value_name = "DIR")]
    cert_dir: Option<PathBuf>,
    /// Read registry logins from this file (docker's config.json format) instead of
    /// $DOCKER_CONFIG/config.json, ~/.docker/config.json and podman's auth.json.
    #[arg(long, value_name = "FILE")]
    authfile: Option<PathBuf>,
    /// Read which registries are insecure from this registries.conf instead of
    /// $CONTAINERS_REGISTRIES_CONF, ~/.config/containers/registries.conf or
    /// /etc/containers/registries.conf (skopeo's option).
    #[arg(long, value_name = "FILE")]
    registries_conf: Option<PathBuf>,
    /// The platform to take from a multi-platform image (default: this machine's); an image
    /// that is not for it is refused, naming the platforms it has.
    #[arg(long, value_name = "OS/ARCH")]
    platform: Option<String>,
}

impl RegistryArgs {
    /// The platform `--platform` names, if it names one.
    fn platform(&self) -> Result<Option<crate::image::Platform>> {
        self.platform.as_deref().map(str::parse).transpose()
    }

    /// How to reach registries, as these options say.
    fn access(&self) -> Result<crate::image::registry::Access> {
        let platform = match &self.platform {
            Some(p) => p.parse()?,
            None => crate::image::Platform::host(),
        };
        Ok(crate::image::registry::Access {
            tls_verify: self.tls_verify,
            cert_dir: self.cert_dir.clone(),
            authfile: self.authfile.clone(),
            registries_conf: self.registries_conf.clone(),
            platform,
            blob_cache: Some(crate::wheel::cache::WheelCache::default_root()?.join("layout")),
        })
    }

    /// `text` as a transport, reaching registries as these options say.
    fn transport(&self, text: &str) -> Result<crate::image::Transport> {
        Ok(text
            .parse::<crate::image::Transport>()?
            .with_access(&self.access()?))
    }
}

/// Build and certify container images for GPU training.
#[derive(Parser, Debug)]
#[command(name = "gpubake", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What a recipe's `files:` may copy, for the commands that read a recipe.
#[derive(clap::Args, Debug, Clone)]
struct RecipeFiles {
    /// Let a recipe's `files:` copy sources from outside the recipe's directory (each entry
    /// may instead say `allow_outside: true`).
    #[arg(long)]
    allow_files_outside: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Resolve a recipe into a lock: exact, ABI-compatible pins, each with the rule that chose it.
    ///
    /// Without RECIPE, resolves the built-in default (PyTorch 2.9 on CUDA 12.8 for H100/H200).
    /// When nothing fits, exits 2 and says which constraint refused what, and what would run.
    /// With -o, also resolves the Python closure (every wheel with its URL, size and sha256)
    /// for the image's platform with uv, and writes it as pylock.NAME.toml beside the lock.
    ///
    /// Example: gpubake resolve recipes/h100-pytorch2.9.yaml -o gpubake.lock --driver 550.54.15
    Resolve {
        /// The recipe (YAML).
        recipe: Option<PathBuf>,
        #[command(flatten)]
        files: RecipeFiles,
        /// Write the lock here (atomically) instead of to standard output, and the closure
        /// beside it.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Write the closure (PEP 751) here instead of pylock.NAME.toml beside the lock.
        #[arg(long, value_name = "FILE")]
        pylock: Option<PathBuf>,
        /// Do not resolve the Python closure (no uv, no index needed).
        #[arg(long, conflicts_with = "pylock")]
        no_closure: bool,
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
    /// The Dockerfile makes the image `gpubake build` makes: a build stage installs the closure
    /// with gpubake's own installer from wheels in the build context, each checked by its
    /// sha256; no index is reached. --context DIR writes that context (the Dockerfile, the
    /// gpubake binary, pylock.toml, the wheels, the recipe's files).
    ///
    /// The template gets `lock` (the whole lock), `python`, `requirements`, `pip`, `env`,
    /// `nccl_conf`, `lock_lines`, `lock_path`, `labels`, `stack`, `venv`, `files` and `version`,
    /// and the filters `sh` (shell quoting) and `dq` (Dockerfile quoting).
    ///
    /// Example: gpubake render recipes/h100-pytorch2.9.yaml --context ctx && docker build ctx
    Render {
        /// The recipe (YAML); the built-in default when absent.
        recipe: Option<PathBuf>,
        #[command(flatten)]
        files: RecipeFiles,
        /// Write the Dockerfile here (atomically) instead of to standard output.
        #[arg(short, long, conflicts_with = "context")]
        output: Option<PathBuf>,
        /// Write the whole build context into this directory (created if missing).
        #[arg(long, value_name = "DIR")]
        context: Option<PathBuf>,
        /// With --context: the closure to install instead of pylock.NAME.toml beside the recipe.
        #[arg(long, value_name = "FILE", requires = "context")]
        pylock: Option<PathBuf>,
        /// With --context: take the wheels from the wheel cache alone.
        #[arg(long, requires = "context")]
        offline: bool,
        /// Leave the Python stack out (a preflight image: probe and presets).
        #[arg(long, conflicts_with_all = ["pylock", "offline"])]
        without_python: bool,
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
    /// Build an image without a daemon: the base, the locked Python stack, the recipe's files,
    /// the probe, the preset.
    ///
    /// The base is read first: a base without the lock's CPython, or for another platform,
    /// fails the build before anything is resolved or written. The Python closure comes from
    /// --pylock, else pylock.NAME.toml beside the recipe (resolved again for this base when it
    /// was resolved for a base of another glibc), else it is resolved with uv into the cache;
    /// a build never writes beside the recipe (--lock-out keeps the lock and closure). Its
    /// wheels are fetched into the wheel cache ($GPUBAKE_CACHE_DIR, else ~/.cache/gpubake) and
    /// installed natively into a virtual environment at /opt/gpubake/venv over the base's
    /// CPython, one layer per large wheel.
    ///
    /// DEST and BASE use skopeo's syntax: oci:DIR[:TAG] (a plain DIR means the same),
    /// docker-archive:FILE[:NAME:TAG], docker-daemon:NAME:TAG (through the Docker Engine) or
    /// docker://REGISTRY/NAME:TAG (pushed or pulled; the pushed manifest has the digest an
    /// OCI-layout build of the same recipe has).
    /// Two builds of the same recipe and base give the same digest (SOURCE_DATE_EPOCH sets the
    /// timestamps, 0 by default); unchanged layers are not written again.
    ///
    /// The recipe is linted first: an image that `certify` would fail for its recipe (a lint
    /// error in its NCCL settings, a secret in `env:`, presets that contradict each other) is
    /// refused (exit 2) before anything is built, unless --skip-checks.
    ///
    /// Example: gpubake build recipes/h100-pytorch2.9.yaml --from oci:./base:latest --to oci:./out:v1
    Build {
        /// The recipe (YAML); the built-in default when absent.
        recipe: Option<PathBuf>,
        #[command(flatten)]
        files: RecipeFiles,
        /// Where to write the image: a layout, an archive, an engine's NAME:TAG or a registry's
        /// tag (a reference by digest names an image that exists and is refused).
        #[arg(long, value_name = "DEST")]
        to: String,
        /// The base image; when absent, the recipe's `base`, pulled from its registry
        /// (`nvidia/cuda:TAG` from Docker Hub, `HOST:PORT/NAME:TAG` from HOST:PORT).
        #[arg(long, value_name = "BASE")]
        from: Option<String>,
        /// Layer compression.
        #[arg(long, value_enum, default_value = "gzip")]
        compression: crate::image::Compression,
        /// Write every layer again: the layer cache knows files by path, size and mtime.
        #[arg(long)]
        no_cache: bool,
        /// Install this closure (PEP 751) instead of pylock.NAME.toml beside the recipe.
        #[arg(long, value_name = "FILE")]
        pylock: Option<PathBuf>,
        /// Build from the pylock and the wheel cache alone: no resolution, no download.
        #[arg(long)]
        offline: bool,
        /// Also write the lock the image holds here (atomically), with the closure it
        /// installs beside it as pylock.NAME.toml, as `resolve -o` writes them.
        #[arg(long, value_name = "FILE", conflicts_with = "engine_build")]
        lock_out: Option<PathBuf>,
        /// Leave the Python stack out: a node preflight image with the probe and presets only.
        #[arg(long, conflicts_with_all = ["pylock", "offline"])]
        without_python: bool,
        /// The most layers the Python stack may take (one per large wheel, then groups; at
        /// least 4: the venv, the small nvidia wheels, the rest, the extras).
        #[arg(long, value_name = "N", default_value_t = 60, value_parser = parse_stack_layers)]
        stack_layers: usize,
        /// Build even when the recipe's lint finds errors (certify will fail the image).
        #[arg(long)]
        skip_checks: bool,
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
        #[command(flatten)]
        registry: RegistryArgs,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// Also write the image's SBOM here (atomically), after the image: the base by its
        /// digest, every wheel with its sha256 and URL, the lock's pins. For a docker://
        /// image it is also attached there as a referrer. Not with --engine-build, whose
        /// engine keeps no manifest of the image's own.
        #[arg(long, value_name = "FILE", conflicts_with = "engine_build")]
        sbom: Option<PathBuf>,
        /// The gpubake binary that serves as the probe in the image for PLATFORM, when that
        /// is not the platform this gpubake runs on (repeatable; an ELF executable for that
        /// platform's machine).
        #[arg(long, value_name = "PLATFORM=PATH", value_parser = parse_probe_binary)]
        probe_binary: Vec<(crate::image::Platform, PathBuf)>,
        /// The SBOM's format: SPDX 2.3 JSON or CycloneDX 1.6 JSON.
        #[arg(
            long,
            value_enum,
            value_name = "FORMAT",
            default_value = "spdx",
            requires = "sbom"
        )]
        sbom_format: crate::sbom::Format,
    },
    /// Copy an image from one transport to another, verifying every blob on the way.
    ///
    /// SRC and DEST use the transports of `build`: oci:DIR[:TAG], docker-archive:FILE[:NAME:TAG],
    /// docker-daemon:NAME:TAG, docker://REGISTRY/NAME:TAG; DEST's name is checked before
    /// anything is read. Every blob of SRC is checked against its manifest and config (digests,
    /// tar streams, diff ids) before anything is written, and a copy that fails leaves DEST as
    /// it was. The manifest is copied byte for byte where both ends keep manifests (layouts,
    /// registries, and archives with an OCI index.json, as gpubake writes them), so the digest
    /// stays the same; a source without one (skopeo's archives, Docker 20.10's `docker save`)
    /// gets one gpubake makes, and says so. docker-archive:FILE without NAME:TAG records no
    /// name, as skopeo writes it.
    /// A push asks the registry for each blob first, mounts blobs from the repository the image
    /// came from when that is in the same registry, and retries a failed upload from the start
    /// of the blob; a pull resumes a broken download and verifies every blob whole.
    ///
    /// Example: gpubake copy oci:./out:v1 docker://registry.example.com/team/train:v1
    Copy {
        /// The image to copy.
        src: String,
        /// Where to copy it.
        dest: String,
        #[command(flatten)]
        registry: RegistryArgs,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Install a Python closure into a filesystem, as `build` installs it into layers.
    ///
    /// For builds that run in a container: the rendered Dockerfile runs it in a build stage.
    /// Each wheel comes from the wheel cache at --wheels (as `render --context` lays it out)
    /// and is checked by its sha256, every file against RECORD, into a virtual environment at
    /// /opt/gpubake/venv under --root, over the CPython of --root (or of --python-root, for a
    /// build stage that installs into an empty directory and copies it onto the image's /).
    /// A root without the closure's CPython is refused, naming what it has.
    ///
    /// Example: gpubake install pylock.train.toml --wheels /ctx/cache --root /stack --python-root /
    Install {
        /// The closure (PEP 751), as `gpubake resolve -o` writes it.
        pylock: PathBuf,
        /// The wheel cache to take wheels from (and fill, unless --offline).
        #[arg(long, value_name = "DIR")]
        wheels: PathBuf,
        /// The filesystem root to install under.
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        /// The filesystem whose CPython the venv runs on, the image's root (default: --root).
        #[arg(long, value_name = "DIR")]
        python_root: Option<PathBuf>,
        /// Take every wheel from --wheels; download none.
        #[arg(long)]
        offline: bool,
    },
    /// Show an image's pins (its io.gpubake.* labels), other labels, layers, presets and
    /// environment.
    ///
    /// With --libraries, show instead its link closure, read statically for any image (built
    /// by gpubake or not): every ELF file's DT_NEEDED resolved as glibc's ld.so would inside
    /// the image (DT_RPATH, the config's LD_LIBRARY_PATH, DT_RUNPATH with $ORIGIN,
    /// /etc/ld.so.cache, the system directories), then the libraries nothing provides,
    /// sonames with more than one provider and which files bind each, libraries bound from
    /// another copy than their siblings, a libcuda.so.1 of the image the loader reaches, and
    /// the bytes of duplicate copies nothing binds. Exits 0 whatever it finds.
    ///
    /// Example: gpubake inspect oci:./out:v1
    ///
    /// Example: gpubake inspect --libraries oci:./out:v1
    Inspect {
        /// The image: oci:DIR[:TAG] (or a plain DIR), docker-archive:FILE[:NAME:TAG],
        /// docker-daemon:NAME:TAG or docker://REGISTRY/NAME[:TAG|@DIGEST].
        image: String,
        #[command(flatten)]
        registry: RegistryArgs,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
        /// Report the image's link closure (unpacks its layers into a temporary directory).
        #[arg(long)]
        libraries: bool,
    },
    /// Re-hash every blob of an image and check that its labels, lock and nccl.conf agree.
    ///
    /// Every blob is checked, each named by the digest its content has when that is not the
    /// manifest's (a damaged config does not stop the layers being read). Exits 1 naming what
    /// disagrees, 2 when the image cannot be read at all. With
    /// --certified (a docker:// image), also exits 1 unless a certificate that `certify
    /// --attach` pushed for this exact digest is attached to it with a passing verdict and a
    /// probe that ran on GPUs; --static-ok also accepts a certificate of the static checks
    /// alone (`certify --gpus none`).
    ///
    /// Example: gpubake verify oci:./out:v1
    Verify {
        /// The image: oci:DIR[:TAG] (or a plain DIR), docker-archive:FILE[:NAME:TAG],
        /// docker-daemon:NAME:TAG or docker://REGISTRY/NAME[:TAG|@DIGEST].
        image: String,
        #[command(flatten)]
        registry: RegistryArgs,
        /// Also require an attached certificate with a passing verdict whose probe ran on GPUs
        /// (docker:// only).
        #[arg(long)]
        certified: bool,
        /// With --certified, also accept a certificate of the static checks alone.
        #[arg(long, requires = "certified")]
        static_ok: bool,
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
    /// 1 a check failed, 3 GPUs were asked for but the engine or GPU runtime is missing. The
    /// certificate records what ran (its `scope`: the static checks alone, or the probe on
    /// which GPUs, full or quick, under what); `verify --certified` accepts a static-only
    /// one only with --static-ok.
    ///
    /// Example: gpubake certify oci:./out:v1 --gpus all --out cert.json --junit cert.xml
    Certify {
        /// The image: oci:DIR[:TAG] (or a plain DIR), docker-archive:FILE[:NAME:TAG],
        /// docker-daemon:NAME:TAG or docker://REGISTRY/NAME[:TAG|@DIGEST].
        image: String,
        #[command(flatten)]
        registry: RegistryArgs,
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
        /// Run the probe under this OCI runtime (crun, runc or a path) instead of a Docker
        /// Engine, GPUs from the node's CDI spec.
        #[arg(long, value_name = "RUNTIME")]
        runtime: Option<String>,
        /// CDI devices for --runtime, e.g. nvidia.com/gpu=all (default: from --gpus).
        #[arg(long = "device", value_name = "CDI-NAME", requires = "runtime")]
        devices: Vec<String>,
        /// Where CDI specs are read for --runtime (default: /etc/cdi and /var/run/cdi).
        #[arg(long = "cdi-spec-dir", value_name = "DIR", requires = "runtime")]
        cdi_spec_dirs: Vec<PathBuf>,
        /// The probe's short run: fewer sizes, no NCCL start-ups.
        #[arg(long)]
        quick: bool,
        /// Seconds to wait for the probe (default: its worst case plus a minute).
        #[arg(long, value_name = "SECONDS")]
        probe_timeout: Option<u64>,
        /// Push the certificate to the registry as an artifact that refers to the image
        /// (an OCI 1.1 referrer; docker:// images only), whatever the verdict.
        #[arg(long)]
        attach: bool,
    },
    /// Check a GPU node from inside the image: the toolkit's injection, NVML, the lock
    /// against the driver and the NCCL PyTorch would load.
    ///
    /// Exits 0 when every check passes (warnings included), 1 when one fails, 2 on bad input
    /// (such as --devices naming a GPU the node does not have), 3 when no GPU is visible,
    /// with what to do about it.
    ///
    /// With --world, every rank of a multi-node run probes its node, then joins a rendezvous
    /// that rank 0 runs on MASTER_PORT + 1 (--world-port to choose): rank 0 prints one verdict
    /// for the world, naming each rank that is missing, died or was slow (exit 3 only when
    /// no rank has a GPU); the other ranks print their own report. The rank and rank 0's
    /// address come from the launcher: torchrun --no-python, srun, mpirun (with MASTER_ADDR),
    /// a PyTorchJob, or an Indexed Job or JobSet (with WORLD_SIZE and MASTER_ADDR in the
    /// manifest). Ranks with a GPU then meet in NCCL (one GPU each, its unique id sent by
    /// rank 0): the verdict adds all-reduce and all-gather bus bandwidth, the transport NCCL
    /// used between each pair of ranks, the slowest pair, and the preset against NCCL's
    /// defaults. See examples/world/.
    ///
    /// Example: docker run --rm --gpus all IMAGE gpubake probe --junit /out/probe.xml
    ///
    /// Example: srun --ntasks-per-node=1 --kill-on-bad-exit=0 gpubake probe --world
    Probe {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Also write the report as JUnit XML here.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Shorter time budgets, fewer sizes, no NCCL runs (bandwidths are still judged).
        #[arg(long)]
        quick: bool,
        /// Also print the all-reduce table: the bundled kernel beside NCCL and a plain copy.
        #[arg(long, conflicts_with = "world")]
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
        /// Probe every rank of a multi-node run; rank 0 gives the verdict for all.
        #[arg(long)]
        world: bool,
        /// The port rank 0 listens on for the other ranks (default: MASTER_PORT + 1, or 29501).
        #[arg(long, value_name = "PORT", requires = "world")]
        world_port: Option<u16>,
        /// Seconds each step may take: reaching rank 0, every rank's hello, every report.
        /// Allow for the slowest node's local probe; at most a day.
        #[arg(
            long,
            value_name = "SECS",
            default_value_t = 300,
            requires = "world",
            value_parser = clap::value_parser!(u64).range(1..=86_400)
        )]
        world_timeout: u64,
        /// Also keep NCCL's INFO log of the runs across ranks in this directory, one file per
        /// rank and run (`nccl-rank3.HOST.PID.log`, `nccl-defaults-rank3...` for the run
        /// under NCCL's defaults), as NCCL wrote it.
        #[arg(long, value_name = "DIR", requires = "world")]
        world_nccl_log: Option<PathBuf>,
        /// The interpreter whose PyTorch the framework phase runs on the GPUs, with its
        /// environment (a venv's bin/python3); default: the image's /opt/gpubake/venv.
        #[arg(long, value_name = "PATH")]
        python: Option<PathBuf>,
    },
    /// The probe's GPU measurements, run by `gpubake probe` in a child process.
    #[command(hide = true)]
    ProbeWorker {
        /// The GPUs by PCI address (`00000000:1B:00.0`, as NVML gives them), since CUDA
        /// ordinals need not follow NVML's indices; all GPUs when absent.
        #[arg(long, value_delimiter = ',')]
        pci_bus_ids: Vec<String>,
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
    /// What differs between two merged presets; exits 1 when they differ, as diff(1) does.
    Diff {
        /// First preset.
        a: String,
        /// Second preset.
        b: String,
    },
}

/// Runs the parsed command line; returns the exit code.
pub fn run(cli: Cli) -> Result<i32> {
    let load_recipe = |path: Option<&Path>, files: &RecipeFiles| {
        load_recipe(path).map(|mut loaded| {
            loaded.allow_files_outside = files.allow_files_outside;
            loaded
        })
    };
    match cli.command {
        Command::Resolve {
            recipe,
            files,
            output,
            pylock,
            no_closure,
            driver,
            explain,
            json,
            preset_dir,
        } => {
            let loaded = load_recipe(recipe.as_deref(), &files)?;
            let opts = Options {
                driver,
                preset_dirs: preset_dir,
                ..Options::default()
            };
            let mut resolved = match resolve::resolve_recipe(&loaded, &opts) {
                Ok(r) => r,
                Err(e) => {
                    // A script that asked for JSON gets JSON on failure too: the error, its
                    // exit code and, for a conflict, its parts.
                    if json {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&e.to_json()).expect("errors serialize")
                        );
                    }
                    return Err(e);
                }
            };
            for w in &resolved.lock.warnings {
                eprintln!("warning: {w}");
            }
            let closure_dir = match (&pylock, &output) {
                _ if no_closure => None,
                (Some(_), _) => Some(PathBuf::new()),
                (None, Some(out)) => Some(out.parent().unwrap_or(Path::new("")).to_path_buf()),
                (None, None) => None,
            };
            if let Some(dir) = closure_dir {
                crate::closure::resolve_platforms(
                    &mut resolved.lock,
                    loaded.recipe.index.as_deref(),
                    pylock.as_deref(),
                    &dir,
                )?;
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
                    preset_dirs: preset_dir,
                    ..Options::default()
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
            Ok(totals.exit_code(&reports, strict))
        }
        Command::Presets {
            action,
            json,
            preset_dir,
        } => presets(action, json, &preset_dir),
        Command::Render {
            recipe,
            files,
            output,
            context,
            pylock,
            offline,
            without_python,
            template,
            driver,
            preset_dir,
        } => {
            let loaded = load_recipe(recipe.as_deref(), &files)?;
            let opts = Options {
                driver,
                preset_dirs: preset_dir,
                ..Options::default()
            };
            let resolved = resolve::resolve_recipe(&loaded, &opts)?;
            let (plan, dockerfile) = render::ContextPlan::with_dockerfile(
                &loaded,
                &resolved.lock,
                !without_python,
                template.as_deref(),
            )?;
            match context {
                None => emit(output.as_deref(), &dockerfile)?,
                Some(dir) => {
                    let entries = plan.entries_for_build(
                        &loaded,
                        &resolved.lock,
                        &dockerfile,
                        recipe.as_deref(),
                        pylock.as_deref(),
                        offline,
                    )?;
                    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
                    crate::image::layer::materialize(entries, 0, &dir)?;
                    eprintln!(
                        "wrote the build context to {}: docker build {}",
                        dir.display(),
                        dir.display()
                    );
                }
            }
            Ok(0)
        }
        Command::Build {
            recipe,
            files,
            to,
            from,
            compression,
            no_cache,
            pylock,
            offline,
            lock_out,
            without_python,
            stack_layers,
            skip_checks,
            engine_build,
            template,
            driver,
            preset_dir,
            registry,
            json,
            sbom,
            sbom_format,
            probe_binary,
        } => {
            let loaded = load_recipe(recipe.as_deref(), &files)?;
            // An SBOM or lock path that could never be written is refused before the build,
            // not after.
            for path in sbom.iter().chain(&lock_out) {
                crate::fsutil::output_target(path)?;
            }
            let to = registry.transport(&to)?.destination()?;
            let explicit = from.is_some();
            let from = match from {
                Some(f) => Some(registry.transport(&f)?),
                // Without --from the recipe's base is pulled from its registry, reached as
                // these options say (the engine build leaves it to the engine).
                None if !engine_build => Some(
                    crate::image::Transport::of_base(&loaded.recipe.base)?
                        .with_access(&registry.access()?),
                ),
                None => None,
            };
            // The base given is the one whose glibc counts, not the recipe's `base:` text.
            // It is read first: a base that cannot serve the image fails the build before
            // anything is resolved over the network or written.
            let recipe_base = |e: Error| match &from {
                Some(base) if !explicit => recipe_base_failed(e, base),
                _ => e,
            };
            let base_glibc = match &from {
                Some(base) if !engine_build => {
                    let note = explicit && !without_python;
                    resolve::glibc_of_base(base, &loaded.recipe.base, note).map_err(recipe_base)?
                }
                _ => None,
            };
            let options = Options {
                driver,
                preset_dirs: preset_dir,
                base_glibc,
            };
            let mut resolved = resolve::resolve_recipe(&loaded, &options)?;
            for w in &resolved.lock.warnings {
                eprintln!("warning: {w}");
            }
            if !skip_checks {
                crate::lint::gate(&loaded, &options)?;
            }
            if engine_build {
                // The engine builds for the machine it runs on, from the linux/amd64 closure
                // the Dockerfile installs: a recipe that names other platforms is built by
                // gpubake itself.
                if resolved.lock.platforms != crate::lock::default_platforms() {
                    return Err(Error::Unsupported(format!(
                        "--engine-build builds linux/amd64 only, and the recipe builds for {}; \
                         build without --engine-build (to oci:, docker:// or, with --platform, \
                         docker-daemon:)",
                        resolved.lock.platforms.join(", ")
                    )));
                }
                return engine_build_image(
                    &loaded,
                    resolved.lock,
                    &to,
                    from.as_ref(),
                    template.as_deref(),
                    (
                        recipe.as_deref(),
                        pylock.as_deref(),
                        offline,
                        without_python,
                    ),
                );
            }
            let only = registry.platform()?;
            if let Some(base) = &from {
                crate::image::build::check_base(base, &resolved, only.as_ref(), !without_python)
                    .map_err(recipe_base)?;
            }
            let cache_dir = crate::wheel::cache::WheelCache::default_root()?;
            // Each platform installs its own closure, read from its own file or resolved
            // into the cache; a build of one platform passes it as the build's closure.
            let closures = if without_python {
                Vec::new()
            } else {
                let source = crate::closure::Source {
                    recipe_file: recipe.as_deref(),
                    explicit: pylock.as_deref(),
                    index: loaded.recipe.index.as_deref(),
                    offline,
                    cache_dir: &cache_dir,
                };
                crate::closure::for_build_platforms(&resolved.lock, &source, only.as_ref())?
            };
            let all: Vec<&crate::closure::Closure> = closures.iter().map(|(_, c)| c).collect();
            crate::closure::settle(&mut resolved.lock, &all)?;
            // A base read from elsewhere than the recipe's registry reference is not the one
            // the base label names: the lock the image carries says what its config says.
            if let Some(base) = &from
                && !crate::image::build::base_is_the_recipes(base, &resolved.lock.base)
            {
                resolved
                    .lock
                    .labels
                    .shift_remove(crate::image::build::BASE_NAME);
            }
            let closure = match closures.as_slice() {
                [(_, one)] => Some(one.clone()),
                _ => None,
            };
            // The SBOM lists every wheel of every platform's closure, once.
            let wheels = crate::sbom::wheels_once(closures.iter().flat_map(|(_, c)| &c.wheels));
            let epoch = crate::image::build::source_date_epoch()?;
            let opts = crate::image::BuildOptions {
                to,
                from: from.clone(),
                compression,
                epoch,
                no_cache,
                closure,
                offline,
                cache_dir,
                stack_layers,
                probe: std::env::current_exe().map_err(|e| Error::io("current executable", e))?,
            };
            let start = std::time::Instant::now();
            let platforms = crate::image::PlatformOptions {
                only,
                probes: probe_binary,
                closures: if closures.len() > 1 {
                    closures.clone()
                } else {
                    Vec::new()
                },
            };
            let report = crate::image::build_for(&loaded, &resolved, &opts, &platforms)
                .map_err(recipe_base)?;
            if let Some(path) = &lock_out {
                crate::closure::write_lock(&resolved.lock, &closures, path)?;
            }
            if let Some(path) = &sbom {
                let base_source = opts
                    .from
                    .as_ref()
                    .map_or_else(|| resolved.lock.base.clone(), ToString::to_string);
                let subject = crate::sbom::Subject {
                    lock: &resolved.lock,
                    wheels: &wheels,
                    base_digest: &report.base,
                    base_source: &base_source,
                    image_digest: &report.manifest,
                    epoch: opts.epoch,
                };
                let attached = crate::image::sbom::write(
                    &subject.render(sbom_format)?,
                    sbom_format.media_type(),
                    path,
                    &opts.to,
                    &report.manifest,
                    &crate::image::build::rfc3339(opts.epoch),
                )?;
                eprintln!("wrote the SBOM to {}", path.display());
                if let Some(artifact) = attached {
                    eprintln!("attached the SBOM to {} as {artifact}", report.image);
                }
            }
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
                if report.platforms.len() > 1 {
                    println!("  index    {}", report.manifest);
                    for p in &report.platforms {
                        println!("  {:<14} manifest {}", p.platform, p.manifest);
                    }
                    println!("  layers of {}:", report.platforms[0].platform);
                } else {
                    println!("  manifest {}", report.manifest);
                }
                if report.image.starts_with("docker-daemon:") {
                    // The engine keeps no manifest of ours: it stores the image under its
                    // config digest, and `inspect docker-daemon:` rebuilds a manifest from
                    // `docker save`, whose digest differs. Name the one the engine shows.
                    println!(
                        "  image ID {} in the engine (what `docker images` shows; the engine \
                         does not keep the manifest above, and `inspect docker-daemon:` \
                         reports one rebuilt from `docker save`)",
                        report.config
                    );
                }
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
        Command::Install {
            pylock,
            wheels,
            root,
            python_root,
            offline,
        } => {
            let text = crate::closure::read_text(&pylock)?;
            let closure = crate::closure::parse(&pylock, &text)?;
            let want = closure.inputs().map(|i| i.python).ok_or_else(|| {
                Error::Closure(format!(
                    "{}: no [tool.gpubake] table names the CPython it was resolved for",
                    pylock.display()
                ))
            })?;
            let python_root = python_root.as_deref().unwrap_or(&root);
            let python = crate::image::stack::find_python_in(python_root, &want).map_err(|m| {
                Error::Environment(format!(
                    "{}: {m}; the venv runs on the CPython of --root, or of --python-root \
                     when the stack is installed apart from the image's filesystem",
                    python_root.display()
                ))
            })?;
            let cache = crate::wheel::cache::WheelCache::open(wheels)?;
            let fetch = crate::wheel::cache::FetchOptions {
                offline,
                ..Default::default()
            };
            let epoch = crate::image::build::source_date_epoch()?;
            let start = std::time::Instant::now();
            let files =
                crate::image::stack::install_into(&root, &closure, &python, &cache, &fetch, epoch)?;
            println!(
                "installed {} wheels ({files} files) into {} over {} in {:.1} s",
                closure.wheels.len(),
                root.join(crate::image::stack::VENV.trim_start_matches('/'))
                    .display(),
                python.path,
                start.elapsed().as_secs_f64()
            );
            Ok(0)
        }
        Command::Copy {
            src,
            dest,
            registry,
            json,
        } => {
            let (src, dest) = (
                registry.transport(&src)?,
                registry.transport(&dest)?.destination()?,
            );
            let start = std::time::Instant::now();
            let copied = src.copy_platforms(&dest, registry.platform()?.as_ref())?;
            let seconds = start.elapsed().as_secs_f64();
            let bytes = copied.bytes;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "from": src.to_string(),
                        "to": dest.to_string(),
                        "manifest": copied.digest,
                        "platforms": copied.platforms,
                        "manifest_made_by_gpubake": copied.made_here,
                        "bytes": bytes,
                        "seconds": seconds,
                    })
                );
            } else {
                println!("copied {src} to {dest} in {seconds:.2} s");
                println!(
                    "  {} {} ({} in {} blobs)",
                    if copied.platforms.is_empty() {
                        "manifest"
                    } else {
                        "index"
                    },
                    copied.digest,
                    crate::image::inspect::human_size(bytes),
                    copied.blobs
                );
                if copied.made_here {
                    println!("  {}", crate::image::inspect::MADE_HERE.trim_start());
                }
                if !copied.platforms.is_empty() {
                    println!("  platforms {}", copied.platforms.join(", "));
                }
            }
            Ok(0)
        }
        Command::Inspect {
            image,
            registry,
            json,
            libraries,
        } => {
            let image = registry.transport(&image)?;
            let platform = registry.platform()?;
            // The link closure or the image's own account, printed alike.
            let (as_json, as_text) = if libraries {
                let links = crate::image::links::of_transport(&image, platform.as_ref())?;
                (serde_json::to_string_pretty(&links), links.to_text())
            } else {
                let info = crate::image::inspect::inspect(&image, platform.as_ref())?;
                (serde_json::to_string_pretty(&info), info.to_text())
            };
            if json {
                println!("{}", as_json.expect("reports serialize"));
            } else {
                print!("{as_text}");
            }
            Ok(0)
        }
        Command::Verify {
            image,
            registry,
            certified,
            static_ok,
            json,
        } => {
            let image = registry.transport(&image)?;
            let v = if certified {
                crate::image::inspect::verify_certified(
                    &image,
                    registry.platform()?.as_ref(),
                    static_ok,
                )?
            } else {
                crate::image::inspect::verify(&image, registry.platform()?.as_ref())?
            };
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
            world,
            world_port,
            world_timeout,
            world_nccl_log,
            python,
        } => {
            let sizes = sizes.map(|s| parse_sizes(&s)).transpose()?;
            let policy = policy
                .map(|path| crate::probe::policy::read(&path))
                .transpose()?;
            let opts = crate::probe::ProbeOptions {
                devices,
                quick,
                sizes,
                policy,
                python,
                no_framework: world,
            };
            let report = if world {
                crate::probe::world::run(
                    &opts,
                    &crate::probe::world::WorldOptions {
                        port: world_port,
                        timeout: std::time::Duration::from_secs(world_timeout),
                        nccl_log: world_nccl_log,
                    },
                )?
            } else {
                crate::probe::run(&opts)?
            };
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
            registry,
            gpus,
            json,
            out,
            junit,
            max_layers,
            max_layer_gib,
            policy,
            runtime,
            devices,
            cdi_spec_dirs,
            quick,
            probe_timeout,
            attach,
        } => {
            let image_ref = registry.transport(&image)?;
            if attach && !matches!(image_ref, crate::image::Transport::Registry(_)) {
                return Err(Error::Usage(format!(
                    "--attach pushes the certificate beside the image in its registry; {image} \
                     is not a docker:// image"
                )));
            }
            // A shift would drop the high bits silently and turn a huge limit into a tiny one.
            let max_layer_bytes = max_layer_gib.checked_mul(1 << 30).ok_or_else(|| {
                Error::Usage(format!(
                    "--max-layer-gib {max_layer_gib}: too large to count in bytes"
                ))
            })?;
            let launcher = match runtime {
                None => crate::certify::Launcher::Engine,
                Some(program) => crate::certify::Launcher::Runtime {
                    program,
                    devices,
                    spec_dirs: if cdi_spec_dirs.is_empty() {
                        crate::cdi::DEFAULT_SPEC_DIRS
                            .iter()
                            .map(PathBuf::from)
                            .collect()
                    } else {
                        cdi_spec_dirs
                    },
                },
            };
            let opts = crate::certify::CertifyOptions {
                gpus,
                launcher,
                max_layers,
                max_layer_bytes,
                policy,
                quick,
                probe_timeout: probe_timeout.map(std::time::Duration::from_secs),
                platform: registry.platform()?,
            };
            let (report, code) = crate::certify::certify(&image_ref, &opts)?;
            let certificate = serde_json::to_string_pretty(&report).expect("reports serialize");
            if attach {
                let artifact = crate::certify::attach(&image_ref, &report, code)?;
                eprintln!("attached the certificate to {image} as {artifact}");
            }
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
                println!("{image}: {}", crate::certify::summary(&report, code));
            }
            Ok(code)
        }
        Command::ProbeWorker {
            pci_bus_ids,
            result,
            task,
        } => {
            let (out, code) = match crate::probe::worker::run(&task, &pci_bus_ids) {
                Ok(v) => (serde_json::json!({ "ok": v }), 0),
                Err(e) => (serde_json::json!({ "error": e }), 1),
            };
            match result {
                Some(path) => crate::fsutil::write_atomic(&path, out.to_string().as_bytes())?,
                None => println!("{out}"),
            }
            Ok(code)
        }
        Command::Compat { release, json } => {
            let db = Compat::embedded();
            if let Some(wanted) = &release {
                db.check_release(wanted)?;
            }
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

/// An error reading the recipe's own base (no --from), with the way around it: most bases
/// are on registries a build machine may not reach.
fn recipe_base_failed(e: Error, base: &crate::image::Transport) -> Error {
    let hint = |m: &String| {
        format!(
            "{m}\nthe recipe's base is pulled from its registry when build has no --from; pass \
             --from with a local copy (oci:DIR[:TAG], docker-archive:FILE) or another registry \
             (docker://REGISTRY/NAME:TAG)"
        )
    };
    match &e {
        Error::Environment(m) if m.starts_with(&base.to_string()) => Error::Environment(hint(m)),
        Error::Usage(m) if m.starts_with(&base.to_string()) => Error::Usage(hint(m)),
        _ => e,
    }
}

/// `--probe-binary PLATFORM=PATH`.
fn parse_probe_binary(
    text: &str,
) -> std::result::Result<(crate::image::Platform, PathBuf), String> {
    let (platform, path) = text
        .split_once('=')
        .filter(|(_, p)| !p.is_empty())
        .ok_or_else(|| format!("`{text}`: expected PLATFORM=PATH, as in linux/arm64=./gpubake"))?;
    let platform: crate::image::Platform = platform.parse().map_err(|e: Error| e.to_string())?;
    platform.buildable()?;
    Ok((platform, PathBuf::from(path)))
}

/// The largest all-reduce size `probe --sizes` takes. Each GPU holds buffers of the largest
/// size, so anything near this could never run; the bound keeps the arithmetic far from
/// overflow too.
const MAX_PROBE_SIZE: u64 = 1 << 40;

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
        let too_large = || {
            Error::Usage(format!(
                "--sizes: `{t}` is too large; a size is at most 1024G (1 TiB), more memory \
                 than any GPU has for the probe's buffers"
            ))
        };
        let n = match digits.parse::<u64>() {
            Ok(n) if n > 0 => n,
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => return Err(too_large()),
            _ => {
                return Err(Error::Usage(format!(
                    "`{t}` is not a size such as 4, 64K or 1G"
                )));
            }
        };
        n.checked_mul(mult)
            .filter(|bytes| *bytes <= MAX_PROBE_SIZE)
            .ok_or_else(too_large)
    };
    if let Some((lo, hi)) = text.split_once(':') {
        let (lo, hi) = (one(lo)?, one(hi)?);
        if lo > hi {
            return Err(Error::Usage(format!(
                "--sizes {text}: the first size is larger than the second"
            )));
        }
        // The step past the last size may not fit in a u64: the ladder ends there.
        let mut out: Vec<u64> = std::iter::successors(Some(lo), |s| s.checked_mul(16))
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

/// `build --engine-build`: renders the Dockerfile and has the Docker engine build it.
fn engine_build_image(
    loaded: &LoadedRecipe,
    mut lock: crate::lock::Lock,
    to: &crate::image::Transport,
    from: Option<&crate::image::Transport>,
    template: Option<&Path>,
    (recipe_file, pylock, offline, without_python): (Option<&Path>, Option<&Path>, bool, bool),
) -> Result<i32> {
    use crate::image::Transport;
    let Transport::DockerDaemon(tag) = to else {
        return Err(Error::Usage(
            "--engine-build writes to the engine: use --to docker-daemon:NAME:TAG".into(),
        ));
    };
    match from {
        None => {}
        Some(Transport::DockerDaemon(base)) => lock.rebase(base.clone()),
        Some(other) => {
            return Err(Error::Usage(format!(
                "--engine-build reads its base from the engine: use --from docker-daemon:NAME:TAG, not {other}"
            )));
        }
    }
    let (plan, dockerfile) =
        render::ContextPlan::with_dockerfile(loaded, &lock, !without_python, template)?;
    let engine = crate::engine::Engine::connect()?;
    let entries =
        plan.entries_for_build(loaded, &lock, &dockerfile, recipe_file, pylock, offline)?;
    // The context is streamed to the engine from a file: it holds every wheel.
    let scratch = crate::interrupt::scratch_dir(None, ".gpubake-context-")
        .map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let tar_path = scratch.path().join("context.tar");
    let file = std::fs::File::create(&tar_path).map_err(|e| Error::io(&tar_path, e))?;
    let file =
        crate::image::layer::write_tar(&entries, 0, std::io::BufWriter::new(file), &tar_path)?;
    file.into_inner()
        .map_err(|e| Error::io(&tar_path, e.into_error()))?
        .sync_all()
        .map_err(|e| Error::io(&tar_path, e))?;
    let start = std::time::Instant::now();
    engine.build(&tar_path, tag, |line| eprintln!("{line}"))?;
    println!(
        "built docker-daemon:{tag} with the engine at {} in {:.1} s",
        engine.host(),
        start.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// `--stack-layers`: a count the stack's plan can honour.
fn parse_stack_layers(text: &str) -> std::result::Result<usize, String> {
    let n: usize = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of layers"))?;
    let min = crate::image::stack::MIN_STACK_LAYERS;
    if n < min {
        return Err(format!(
            "the stack takes at least {min} layers (the venv, the small nvidia wheels, the rest \
             of the closure, the recipe's extras)"
        ));
    }
    Ok(n)
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
    let mut list_code = 0;
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
            // One broken file does not hide the others: it is named with its error, and the
            // listing exits 2 as bad input.
            let mut broken = Vec::new();
            for name in catalog.names() {
                let p = match catalog.load(&name, &here, None) {
                    Ok(p) => p,
                    Err(e) => {
                        broken.push(format!("{name}: {e}"));
                        continue;
                    }
                };
                rows.push(Row {
                    name,
                    requires_nccl: p.file.requires.nccl.as_ref().map(ToString::to_string),
                    debug: p.file.debug,
                    file: p.doc.name().to_string(),
                    description: p.file.description,
                    extends: p.file.extends,
                });
            }
            for b in &broken {
                eprintln!("error: preset {b}");
            }
            if !broken.is_empty() {
                list_code = 2;
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
            // diff(1)'s convention, so scripts can test for a difference.
            return Ok(if rows.is_empty() { 0 } else { 1 });
        }
    }
    Ok(list_code)
}

/// Prints an error the way every command does, and returns its exit code.
pub fn report_error(err: &Error) -> i32 {
    eprintln!("error: {err}");
    err.exit_code()
}
