//! The lock: every pin of an image with the rule that chose it, the driver floor, the merged
//! NCCL environment with the preset that set each variable, and the recipe's digest. Builds,
//! Dockerfiles and certificates are made from the lock, never from the recipe directly.

use crate::preset::MergedEnv;
use crate::version::Version;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// Where in the image the lock is stored.
pub const LOCK_PATH_IN_IMAGE: &str = "/etc/gpubake/lock.yaml";

/// The label that says where the Python stack is: the venv's path, or `none` for an image
/// built with `--without-python` (a preflight image, which certify does not hold to the
/// lock's Python pins).
pub const STACK_LABEL: &str = "io.gpubake.python-stack";

/// The label that says what a gpubake image is, where it is not a training image of a lock:
/// [`PROBE_KIND`] for a probe image (`pytorch: none`), which holds no lock.
pub const KIND_LABEL: &str = "io.gpubake.kind";

/// [`KIND_LABEL`]'s value for a probe image.
pub const PROBE_KIND: &str = "probe";

/// The label with the version of the gpubake that built a probe image (a training image's
/// lock says it instead).
pub const VERSION_LABEL: &str = "io.gpubake.version";

/// The OCI annotation (and label) that names the image's base.
pub const BASE_NAME: &str = "org.opencontainers.image.base.name";

/// One OS package of the lock: a file of a Debian-style archive, as its Packages index lists
/// it (whose hash the archive's signed InRelease lists).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SystemPackage {
    /// The package name (`numactl`).
    pub name: String,
    /// Its exact version (`2.0.16-1`).
    pub version: String,
    /// Its architecture (`amd64`, or `all`).
    pub architecture: String,
    /// Where the .deb is fetched: the archive's URL and the index's `Filename`.
    pub url: String,
    /// Its size in bytes.
    pub size: u64,
    /// The SHA256 of the .deb, lower-case hex.
    pub sha256: String,
    /// The source package it is built from, where that is not its own name (`glibc` for
    /// libc6); left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// A resolved recipe.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    /// The gpubake version that wrote it.
    pub gpubake: String,
    /// The recipe it came from.
    pub recipe: RecipeRef,
    /// The base image.
    pub base: String,
    /// PyTorch.
    pub torch: TorchPin,
    /// CPython.
    pub python: Pin,
    /// CUDA as the wheel ships it.
    pub cuda: CudaPin,
    /// cuDNN.
    pub cudnn: Pin,
    /// NCCL.
    pub nccl: Pin,
    /// The oldest driver the image runs on.
    pub driver: DriverPin,
    /// What the wheels need from the base image.
    pub platform: BaseAbi,
    /// The OCI platforms the image is built for (`linux/amd64`, `linux/arm64`), as the
    /// recipe's `platforms:` names them. Left out when it is linux/amd64 alone, the default,
    /// so that the locks (and images) of recipes without `platforms:` stay as they were.
    #[serde(
        default = "default_platforms",
        skip_serializing_if = "is_default_platforms"
    )]
    pub platforms: Vec<String>,
    /// Target GPUs and the code that runs on each.
    #[serde(default)]
    pub gpus: Vec<GpuPin>,
    /// Exact pip requirements, installed together from `torch.index_url`.
    pub packages: IndexMap<String, String>,
    /// The recipe's extra pip requirements, installed afterwards.
    #[serde(default)]
    pub pip: Vec<String>,
    /// The OS packages installed on the base from its distribution's archive (Debian,
    /// Ubuntu), each pinned from the archive's signed index, in the order they are unpacked.
    /// Left out when the recipe asks for none, so other locks keep their bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system: Vec<SystemPackage>,
    /// The recipe's `system:` asks those pins were resolved for (`name` or `name=version`),
    /// so that a build taking its pins from this lock knows they are the recipe's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_asked: Vec<String>,
    /// What nvidia-container-toolkit reads from the image.
    pub nvidia: NvidiaEnv,
    /// The merged environment, sorted by name, with provenance.
    pub env: MergedEnv,
    /// Image labels: pins and the recipe's own.
    pub labels: IndexMap<String, String>,
    /// Things a person should know about this lock (unconfirmed data, PTX-only GPUs).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Each package of the closure that has several wheels for the platform, with the one
    /// installed and why (the installer's tag order). Written from the closure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wheels: Vec<WheelChoice>,
}

/// Which of a package's fitting wheels the image installs, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WheelChoice {
    /// The package.
    pub package: String,
    /// The platform the closure is for (`x86_64-manylinux_2_39`).
    pub platform: String,
    /// The wheel installed (its file name).
    pub wheel: String,
    /// The rule: its best tag and place in the target's tag order, against the others'.
    pub rule: String,
}

/// The recipe a lock came from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RecipeRef {
    /// The recipe's `name`.
    pub name: String,
    /// The file.
    pub file: String,
    /// sha256 of the file's bytes.
    pub sha256: String,
}

/// A pinned version and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    /// The version; None when the database does not know it.
    pub version: Option<Version>,
    /// The rule that chose it.
    pub rule: String,
    /// Not read from the shipped wheel.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unconfirmed: bool,
}

/// The PyTorch build.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TorchPin {
    /// `2.9.1`.
    pub version: Version,
    /// `cu128`.
    pub variant: String,
    /// The pip requirement, `torch==2.9.1+cu128`.
    pub requirement: String,
    /// The index that serves it.
    pub index_url: String,
    /// A plain `pip install torch` gets this build.
    pub pypi_default: bool,
    /// The rule that chose it.
    pub rule: String,
}

/// CUDA as shipped in the wheels.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CudaPin {
    /// CUDA major.minor.
    pub version: Version,
    /// The CUDA runtime package version.
    pub runtime: Option<String>,
    /// cuBLAS.
    pub cublas: Option<String>,
    /// The cuda-toolkit meta-package, for CUDA 13 wheels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolkit: Option<String>,
    /// The rule.
    pub rule: String,
}

/// Driver floors.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DriverPin {
    /// The oldest driver that runs the image (minor-version compatibility).
    pub min: Version,
    /// The driver the CUDA toolkit shipped with: every feature, PTX JIT included.
    pub recommended: Option<Version>,
    /// The fleet's floor, as the recipe or `--driver` gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<Version>,
    /// The rule.
    pub rule: String,
}

/// What the wheels need from the base image.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BaseAbi {
    /// Oldest glibc.
    pub glibc: Version,
    /// C++11 ABI of libtorch (matters for C++/CUDA extensions).
    pub cxx11_abi: bool,
    /// glibc of the base image, when known from its name or read from the base itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_glibc: Option<Version>,
    /// Where `base_glibc` comes from: the distribution named by the recipe's `base`, or the
    /// base image's own libc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_glibc_from: Option<String>,
}

/// A target GPU.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuPin {
    /// As the recipe named it.
    pub name: String,
    /// Its arch.
    pub arch: String,
    /// The wheel's code that runs on it: `sm_90` (SASS) or `compute_120 (PTX)`.
    pub runs: String,
}

/// The image environment nvidia-container-toolkit reads.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvidiaEnv {
    /// `NVIDIA_VISIBLE_DEVICES`.
    pub visible_devices: String,
    /// `NVIDIA_DRIVER_CAPABILITIES`.
    pub driver_capabilities: String,
    /// `NVIDIA_REQUIRE_CUDA`, in the toolkit's grammar.
    pub require_cuda: String,
}

/// The platforms of a lock that names none.
pub fn default_platforms() -> Vec<String> {
    vec!["linux/amd64".to_string()]
}

fn is_default_platforms(p: &[String]) -> bool {
    p == default_platforms().as_slice()
}

impl Lock {
    /// The platforms the image is built for, parsed.
    pub fn platforms(&self) -> Vec<crate::image::Platform> {
        self.platforms
            .iter()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// The lock of an image built on `base`, an image of the engine's own store rather than
    /// the recipe's registry reference: the base label, which would name that registry, goes.
    pub fn rebase(&mut self, base: String) {
        self.base = base;
        self.labels.shift_remove(BASE_NAME);
    }

    /// The lock of an image built on `base` as the build read it: a base read from elsewhere
    /// than the recipe's registry reference is not the one the base label names, so the label
    /// goes, and the lock the image carries says what its config says.
    /// `named` is the registry reference the base is a copy of (`--base-name`), which the
    /// label names instead.
    pub fn built_on(&mut self, base: &crate::image::Transport, named: Option<&str>) {
        if let Some(name) = named {
            self.labels.insert(BASE_NAME.to_string(), name.to_string());
        } else if !base.is_registry_reference(&self.base) {
            self.labels.shift_remove(BASE_NAME);
        }
    }

    /// The lock as YAML, with a header naming its origin.
    pub fn to_yaml(&self) -> String {
        let body = serde_yaml::to_string(self).expect("locks serialize");
        format!(
            "# gpubake lock for recipe `{}` ({}); written by `gpubake resolve`, do not edit.\n{body}",
            self.recipe.name, self.recipe.file
        )
    }

    /// Records the OS packages `pins` resolved for the recipe's `system:` `asked`.
    pub fn set_system(&mut self, asked: &[String], pins: Vec<SystemPackage>) {
        self.system_asked = if pins.is_empty() {
            Vec::new()
        } else {
            asked.to_vec()
        };
        self.system = pins;
    }

    /// Every environment variable the image sets: the merged presets and the NVIDIA ones.
    pub fn image_env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .env
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v.value.clone()))
            .collect();
        env.push((
            "NVIDIA_VISIBLE_DEVICES".into(),
            self.nvidia.visible_devices.clone(),
        ));
        env.push((
            "NVIDIA_DRIVER_CAPABILITIES".into(),
            self.nvidia.driver_capabilities.clone(),
        ));
        env.push((
            "NVIDIA_REQUIRE_CUDA".into(),
            self.nvidia.require_cuda.clone(),
        ));
        env
    }

    /// Every pip requirement of the framework layer, `name==version` style.
    pub fn requirements(&self) -> Vec<String> {
        self.packages
            .iter()
            .map(|(name, spec)| format!("{name}{spec}"))
            .collect()
    }
}
