//! The command line: a thin shell that parses arguments, calls one stage, and prints its
//! result as text or JSON. Exit codes: 0 pass, 1 a check failed, 2 bad input or usage,
//! 3 something the environment lacks.
//!
//! Each subcommand is a module with its arguments (`Args`) and a `run` that converts them,
//! calls the library and prints; [`run`] dispatches to it.

pub mod build;
pub mod certify;
pub mod compat;
pub mod copy;
pub mod gc;
pub mod inspect;
pub mod install;
pub mod key;
pub mod lint;
pub mod preflight;
pub mod presets;
pub mod probe;
pub mod probe_worker;
pub mod render;
pub mod resolve;
pub mod shell;
pub mod verify;

use crate::error::{Error, Result};
use crate::recipe::{DEFAULT_RECIPE, LoadedRecipe};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};

/// How to reach registries (`docker://`), with skopeo's option names.
#[derive(clap::Args, Debug, Clone)]
pub struct RegistryArgs {
    /// Check registries' TLS certificates. --tls-verify=false accepts any certificate and,
    /// where HTTPS fails, tries plain HTTP, as skopeo does. Without the option, so it goes for
    /// a registry marked `insecure = true` in registries.conf or listed in docker's
    /// daemon.json `insecure-registries`, as skopeo and docker treat them; --tls-verify=true
    /// checks those too. Without the option a loopback registry is reached over plain HTTP
    /// when it speaks only that, as docker does; --tls-verify=true means HTTPS with a checked
    /// certificate there too, as skopeo reads it. Credentials go over plain HTTP only to
    /// loopback or to a marked registry.
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
            blob_cache: Some(crate::fsutil::cache_root()?.join("layout")),
        })
    }

    /// `text` as a transport, reaching registries as these options say.
    fn transport(&self, text: &str) -> Result<crate::image::Transport> {
        Ok(text
            .parse::<crate::image::Transport>()?
            .with_access(&self.access()?))
    }
}

/// What a recipe's `files:` may copy, for the commands that read a recipe.
#[derive(clap::Args, Debug, Clone)]
pub struct RecipeFiles {
    /// Let a recipe's `files:` copy sources from outside the recipe's directory (each entry
    /// may instead say `allow_outside: true`).
    #[arg(long)]
    allow_files_outside: bool,
}

impl RecipeFiles {
    /// The recipe at `path`, or the built-in default (said on standard error), whose `files:`
    /// may copy as these options say.
    fn load(&self, path: Option<&Path>) -> Result<LoadedRecipe> {
        let mut loaded = match path {
            Some(p) => LoadedRecipe::read(p)?,
            None => {
                eprintln!(
                    "gpubake: no recipe given, using the built-in default recipes/{DEFAULT_RECIPE}"
                );
                LoadedRecipe::builtin_default()
            }
        };
        loaded.allow_files_outside = self.allow_files_outside;
        Ok(loaded)
    }
}

/// An image to read and how to reach it, for the commands that read one image.
#[derive(clap::Args, Debug, Clone)]
pub struct ImageArgs {
    /// The image: oci:DIR[:TAG] (or a plain DIR), docker-archive:FILE[:NAME:TAG],
    /// docker-daemon:NAME:TAG or docker://REGISTRY/NAME[:TAG|@DIGEST].
    image: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

impl ImageArgs {
    /// The image as a transport, and the platform `--platform` names, if it names one.
    fn open(&self) -> Result<(crate::image::Transport, Option<crate::image::Platform>)> {
        let image = self.registry.transport(&self.image)?;
        Ok((image, self.registry.platform()?))
    }
}

/// The recipe at `recipe` (see [`RecipeFiles::load`]), and the resolve options of `driver`
/// and `preset_dirs`, for the commands that resolve a recipe.
fn recipe_options(
    files: &RecipeFiles,
    recipe: Option<&Path>,
    driver: Option<crate::version::Version>,
    preset_dirs: Vec<PathBuf>,
) -> Result<(LoadedRecipe, crate::resolve::Options)> {
    let loaded = files.load(recipe)?;
    let opts = crate::resolve::Options {
        driver,
        preset_dirs,
        ..crate::resolve::Options::default()
    };
    Ok((loaded, opts))
}

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
    /// With -o, also resolves the Python closure (every wheel with its URL, size and sha256)
    /// for the image's platform with uv, and writes it as pylock.NAME.toml beside the lock.
    ///
    /// Example: gpubake resolve recipes/h100-pytorch2.9.yaml -o gpubake.lock --driver 550.54.15
    Resolve(resolve::Args),
    /// Check the NCCL settings of recipes, presets and nccl.conf files.
    ///
    /// Reports unknown names, values NCCL rejects, clamps or misparses, variables the pinned
    /// NCCL does not read, and production risks. Exits 0 when the files are clean, 1 when a
    /// finding is an error (and on warnings with --strict), 2 when a file cannot be read as a
    /// recipe, preset or nccl.conf at all: a missing file, YAML that does not parse, an
    /// unknown field, a preset that does not exist.
    ///
    /// Example: gpubake lint recipes/*.yaml env-presets/*.yaml /etc/nccl.conf
    Lint(lint::Args),
    /// List, show and compare NCCL presets, with where each value comes from.
    ///
    /// Example: gpubake presets show nvlink; gpubake presets diff pcie nvlink
    Presets(presets::Args),
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
    Render(render::Args),
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
    Build(Box<build::Args>),
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
    Copy(copy::Args),
    /// Remove what a layout or gpubake's cache holds that nothing needs.
    ///
    /// From a layout (oci:DIR): the temporary files of writes that were killed (SIGKILL, a
    /// crash, a lost node) and the blobs its index.json does not reach, as `umoci gc` finds
    /// them, with gpubake's records of those blobs. Every image the index names, and what
    /// is attached to it there, stays.
    ///
    /// From the cache (--cache): the temporary files and interrupted downloads no live
    /// process owns, and the layer cache's blobs that no record, manifest or index there
    /// names, and its blobs whose bytes no longer match their digest (a build writes them
    /// again). Every wheel, every recorded layer and every pulled image stays: they are what
    /// the next build takes instead of downloading and compressing again (remove the
    /// directory to drop them).
    ///
    /// A layout whose index.json, manifests or records cannot be read, or do not match
    /// their digests and sizes, is named and left as it is: what it needs is unknown.
    ///
    /// Builds and copies remove what killed ones left in the layout they write on their
    /// own; gc also finds blobs. It waits for the builds writing the layout, or using the
    /// cache, to finish first, and removes nothing they write.
    ///
    /// Example: gpubake gc oci:./out --dry-run
    ///
    /// Example: gpubake gc --cache
    Gc(gc::Args),
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
    Install(install::Args),
    /// Show an image's pins (its io.gpubake.* labels), other labels, layers, presets and
    /// environment.
    ///
    /// For a docker:// image, also the artifacts attached to it. Their verdicts are the
    /// listing's annotations, which anyone who can push writes, and are labelled unchecked;
    /// with --key PUB.pem each bundle's signature is checked and the signed verdict shown.
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
    Inspect(inspect::Args),
    /// Re-hash every blob of an image and check that its labels, lock and nccl.conf agree.
    ///
    /// Every blob is checked, each named by the digest its content has when that is not the
    /// manifest's (a damaged config does not stop the layers being read). A docker:// image
    /// is judged by the bytes the registry serves now: every blob is downloaded afresh, never
    /// taken from the blob cache. Exits 1 naming what disagrees, 2 when the image cannot be
    /// read at all.
    ///
    /// With --key (a docker:// image), the check is of what is signed for the manifest's
    /// digest instead: the manifest and the config are read and checked against their
    /// digests, no layer is downloaded (the digest binds them all; a pull verifies each), and
    /// --blobs adds the full re-hash. --key alone exits 1 unless the manifest carries a
    /// signature made with the key; with --certified, unless a certificate that `certify
    /// --attach` pushed for this exact digest, signed with the key, is attached to it with a
    /// passing verdict and a probe that ran on GPUs; --static-ok also accepts a certificate of
    /// the static checks alone (`certify --gpus none`).
    ///
    /// Example: gpubake verify oci:./out:v1
    ///
    /// Example: gpubake verify docker://registry.example.com/team/train:v1 --certified --key cosign.pub
    Verify(verify::Args),
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
    Certify(certify::Args),
    /// Make the ECDSA P-256 key pair `build --key` and `certify --key` sign with, in the
    /// files cosign and skopeo use.
    ///
    /// `key generate --output-prefix PREFIX` writes PREFIX.key, the private key encrypted as
    /// cosign and skopeo read it (`cosign sign --key`, `skopeo copy
    /// --sign-by-sigstore-private-key`), mode 0600, and PREFIX.pub, the public key that
    /// `verify --key`, cosign and a containers policy.json's sigstoreSigned keyPath check
    /// signatures with. Existing files are never overwritten (exit 2). The passphrase is the
    /// first line of --passphrase-file (as skopeo's --sign-passphrase-file reads it), else
    /// $GPUBAKE_KEY_PASSPHRASE, else empty. `key public KEY` prints the public key of a
    /// private key (encrypted, PKCS#8 or SEC1 PEM) on standard output, and its hint (how a
    /// Sigstore bundle names the key) on standard error.
    ///
    /// Example: gpubake key generate --output-prefix cosign && gpubake key public cosign.key
    Key(key::Args),
    /// Check a GPU node from inside the image: the toolkit's injection, NVML, the lock
    /// against the driver and the NCCL PyTorch would load.
    ///
    /// Levels, each with a hard time budget a scheduler can allow for:
    ///
    /// 1 (passive, <= 10 s): the environment, the toolkit's injection and device nodes, the
    /// container's limits, NVML's health of each GPU (ECC, retired and remapped rows, clocks,
    /// throttle reasons, PCIe and NVLink, fabric state), cuInit, the driver against the lock.
    ///
    /// 2 (active, the default, <= 120 s): level 1, then CUDA copies and P2P, the bundled
    /// all-reduce beside NCCL, the preset against NCCL's defaults, NCCL's effective settings,
    /// and the image's PyTorch on the GPUs.
    ///
    /// 3 (burn, <= 120 s + --burn-seconds + 60 s): level 2, then bf16 GEMMs on every GPU at
    /// once for --burn-seconds (default 600) with clocks, throttle reasons, power, temperature,
    /// ECC and remapped rows read under load, the rate against the model's floor, and a
    /// silent-corruption check: results exact by construction compared bit for bit across
    /// repeats, across GPUs and against tiles computed on the CPU.
    ///
    /// A level still running at the end of its budget is stopped and fails, naming the step
    /// it was in. --quick keeps its meaning at every level: shorter steps, fewer sizes, no
    /// NCCL runs.
    ///
    /// Exits 0 when every check passes (warnings included), 1 when one fails (a Slurm prolog
    /// or epilog drains the node on it; a Kubernetes readiness probe reports the node not
    /// ready), 2 on bad input (such as --devices naming a GPU the node does not have), 3 when
    /// no GPU is visible, with what to do about it. Each failed check carries the action it
    /// calls for (none, re-run, reset the GPU, reboot, drain and replace) and its source.
    /// --emit writes what node_exporter's textfile collector and Node Feature Discovery read.
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
    /// Example: gpubake probe --level 1 --emit prometheus:/var/lib/node_exporter/gpubake.prom
    ///
    /// Example: srun --ntasks-per-node=1 --kill-on-bad-exit=0 gpubake probe --world
    Probe(probe::Args),
    /// Check this host before any container starts: can its engines give containers their
    /// GPUs?
    ///
    /// Reads, without a GPU call or an engine's API: the NVIDIA kernel modules against the NVML
    /// library the toolkit loads, nvidia_uvm, nvidia_peermem beside RDMA devices, the
    /// persistence daemon and an NVSwitch system's fabric manager; the NVIDIA Container Toolkit (its programs, package version
    /// and /etc/nvidia-container-runtime/config.toml: mode, ldconfig, low-level runtimes);
    /// Docker's daemon.json (the `--gpus` device driver, the `nvidia` runtime,
    /// default-runtime, CDI by Docker's version, a config newer than the running dockerd);
    /// containerd's config.toml with its imports (the `nvidia` runtime under the CRI plugin of
    /// the config's version, a toolkit drop-in no import reaches, enable_cdi, SystemdCgroup);
    /// CRI-O's crio.conf and drop-ins (the `nvidia` runtime, a drop-in where CRI-O does not
    /// read); podman's CDI directories and the toolkit's legacy OCI hook; the CDI specs in
    /// every directory these read, against the running driver; and the legacy
    /// hook under the systemd cgroup driver, which loses the GPUs of running containers on a
    /// `systemctl daemon-reload`. Each finding names the error a user would see and the fix.
    ///
    /// Exits 0 when the host is ready (warnings included), 1 when a check fails, 3 when no
    /// NVIDIA driver is loaded.
    ///
    /// Example: gpubake preflight --junit preflight.xml
    ///
    /// Example: docker run --rm -v /:/host:ro IMAGE gpubake preflight --root /host
    Preflight(preflight::Args),
    /// The probe's GPU measurements, run by `gpubake probe` in a child process.
    #[command(hide = true)]
    ProbeWorker(probe_worker::Args),
    /// Print the compatibility database: PyTorch builds, their pins, Pythons, archs, drivers.
    ///
    /// `?` marks values not confirmed from the shipped wheel.
    ///
    /// Example: gpubake compat --release 2.9
    Compat(compat::Args),
    /// Print a shell's completion script: bash, zsh, fish, elvish or powershell.
    ///
    /// bash-completion loads it from ~/.local/share/bash-completion/completions/gpubake.
    ///
    /// Example: gpubake completions bash
    Completions(shell::CompletionsArgs),
    /// Write the man pages of gpubake and of each command into a directory.
    ///
    /// Example: gpubake man ~/.local/share/man/man1 && man gpubake-certify
    Man(shell::ManArgs),
}

/// Runs the parsed command line; returns the exit code.
pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Resolve(args) => resolve::run(args),
        Command::Lint(args) => lint::run(args),
        Command::Presets(args) => presets::run(args),
        Command::Render(args) => render::run(args),
        Command::Build(args) => build::run(*args),
        Command::Copy(args) => copy::run(args),
        Command::Gc(args) => gc::run(args),
        Command::Install(args) => install::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Certify(args) => certify::run(args),
        Command::Key(args) => key::run(args),
        Command::Probe(args) => probe::run(args),
        Command::Preflight(args) => preflight::run(args),
        Command::ProbeWorker(args) => probe_worker::run(args),
        Command::Compat(args) => compat::run(args),
        Command::Completions(args) => shell::completions(args),
        Command::Man(args) => shell::man(args),
    }
}

/// Writes `text` to `path` atomically, or to standard output.
fn emit(path: Option<&Path>, text: &str) -> Result<()> {
    match path {
        Some(p) => crate::fsutil::write_atomic(p, text.as_bytes()),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .map_err(|e| Error::writing("<stdout>", e))
        }
    }
}

/// Prints `value` as pretty JSON on standard output.
fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("reports serialize")
    );
}

/// Prints an error the way every command does, and returns its exit code.
pub fn report_error(err: &Error) -> i32 {
    eprintln!("error: {err}");
    err.exit_code()
}
