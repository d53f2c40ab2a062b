//! The compatibility database: which PyTorch builds exist, what each pins (CUDA, cuDNN, NCCL,
//! runtime), which Pythons, glibc and GPU archs it supports, and which driver each CUDA needs.
//!
//! The data is YAML embedded in the binary (`data/compat.yaml`, `data/gpus.yaml`) so resolving
//! is offline and the same everywhere; `gpubake compat` prints it.

use crate::version::Version;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

const COMPAT_YAML: &str = include_str!("../data/compat.yaml");
const GPUS_YAML: &str = include_str!("../data/gpus.yaml");

/// The whole database.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Compat {
    /// When the facts were gathered.
    pub generated: String,
    /// Driver floors.
    pub drivers: Drivers,
    /// PyTorch releases, oldest first.
    pub releases: Vec<Release>,
    /// GPU models and their archs.
    #[serde(default)]
    pub gpus: Vec<GpuFamily>,
}

/// Driver floors per CUDA major (minor-version compatibility) and per toolkit (GA driver).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Drivers {
    /// The oldest driver that runs anything built for a CUDA major.
    pub families: Vec<DriverFamily>,
    /// The driver each CUDA toolkit shipped with.
    pub toolkits: Vec<Toolkit>,
}

/// Minor-version compatibility floor of one CUDA major.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DriverFamily {
    /// The CUDA major version.
    pub cuda_major: u64,
    /// The oldest driver that runs code built for it.
    pub min_driver: Version,
    /// The exact number is from secondary sources.
    #[serde(default)]
    pub unconfirmed: bool,
    /// Where the number comes from.
    #[serde(default)]
    pub note: Option<String>,
}

/// The driver a CUDA toolkit release shipped with.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Toolkit {
    /// CUDA major.minor.
    pub cuda: Version,
    /// The GA driver, when known.
    pub ga_driver: Option<Version>,
    /// The number is from secondary sources.
    #[serde(default)]
    pub unconfirmed: bool,
}

/// One PyTorch minor release and its CUDA variants.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// `2.9`.
    pub release: Version,
    /// Patch releases, oldest first.
    pub patches: Vec<Version>,
    /// CPython versions with wheels.
    pub python: Vec<String>,
    /// Free-threaded CPython builds with wheels (`3.13t`).
    #[serde(default)]
    pub free_threaded: Vec<String>,
    /// Oldest glibc the wheels load on.
    pub glibc: Version,
    /// Built with the C++11 ABI (`_GLIBCXX_USE_CXX11_ABI=1`).
    pub cxx11_abi: bool,
    /// CUDA variants, PyPI default first.
    pub variants: Vec<Variant>,
}

/// One CUDA variant of a release (`cu128`).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// `cu128`.
    pub tag: String,
    /// CUDA major.minor it was built with.
    pub cuda: Version,
    /// The build a plain `pip install torch` gets.
    pub pypi_default: bool,
    /// NCCL pin; None when unknown.
    pub nccl: Option<Version>,
    /// cuDNN pin.
    pub cudnn: Option<Version>,
    /// CUDA runtime pin.
    pub cuda_runtime: Option<String>,
    /// cuBLAS pin (a version, or a range as the wheel states it).
    pub cublas: Option<String>,
    /// The `cuda-toolkit` meta-package version the wheel depends on (CUDA 13 builds).
    #[serde(default)]
    pub cuda_toolkit: Option<String>,
    /// GPU archs with SASS in the wheel.
    pub archs: Vec<Arch>,
    /// The PTX arch shipped for JIT, if any.
    #[serde(default)]
    pub ptx: Option<Arch>,
    /// The wheel's own `Requires-Dist` pins, when known.
    #[serde(default)]
    pub requires: IndexMap<String, String>,
    /// Fields not read from the shipped wheel.
    #[serde(default)]
    pub unconfirmed: Vec<String>,
    /// Caveats.
    #[serde(default)]
    pub note: Option<String>,
}

impl Variant {
    /// The PyPI index that serves this variant's wheels.
    pub fn index_url(&self) -> String {
        format!("https://download.pytorch.org/whl/{}", self.tag)
    }

    /// The suffix NVIDIA's pip packages carry for this CUDA major (`cu12`).
    pub fn package_suffix(&self) -> String {
        format!("cu{}", self.cuda.major())
    }
}

/// A GPU compute capability such as `sm_90`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch {
    /// Major (9 for sm_90).
    pub major: u32,
    /// Minor (0 for sm_90).
    pub minor: u32,
}

impl FromStr for Arch {
    type Err = String;

    /// Accepts `sm_90`, `sm_90a`, `compute_90`, `9.0` and `90`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not a GPU arch: expected sm_90, compute_90 or 9.0");
        let t = text.trim().to_ascii_lowercase();
        if let Some((major, minor)) = t.split_once('.') {
            return Ok(Arch {
                major: major.parse().map_err(|_| bad())?,
                minor: minor.parse().map_err(|_| bad())?,
            });
        }
        let digits = t
            .strip_prefix("sm_")
            .or_else(|| t.strip_prefix("compute_"))
            .unwrap_or(&t)
            .trim_end_matches(['a', 'f']);
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let (major, minor) = digits.split_at(digits.len() - 1);
        Ok(Arch {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

impl Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Arch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// How a wheel's code reaches a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Machine code for this arch, or for an older minor of the same major.
    Sass(Arch),
    /// Only PTX, compiled by the driver at load time.
    Ptx(Arch),
}

/// Whether code built for `sass` (and `ptx`) runs on a GPU of arch `gpu`.
pub fn coverage(sass: &[Arch], ptx: Option<Arch>, gpu: Arch) -> Option<Coverage> {
    sass.iter()
        .filter(|a| a.major == gpu.major && a.minor <= gpu.minor)
        .max()
        .map(|a| Coverage::Sass(*a))
        .or_else(|| ptx.filter(|p| *p <= gpu).map(Coverage::Ptx))
}

/// GPU models that share an arch.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFamily {
    /// Their arch.
    pub arch: Arch,
    /// Marketing family name.
    pub family: String,
    /// Lower-case model names as recipes write them.
    pub models: Vec<String>,
    /// Models whose cards have no NVLink at all: GPUs talk over PCIe only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_nvlink: Vec<String>,
    /// Models whose NVLink is a bridge joining a few cards (PCIe boards), not every GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_bridge: Vec<String>,
    /// Models whose host CPU is Arm (Grace superchips): their nodes run aarch64 images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arm_hosts: Vec<String>,
}

/// How the GPUs of one model reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLinks {
    /// No NVLink: PCIe only.
    PcieOnly,
    /// NVLink only between the cards a bridge joins.
    Bridged,
}

impl Compat {
    /// Refuses `--release RELEASE` when the database has no such PyTorch release, naming the
    /// ones it has.
    pub fn check_release(&self, wanted: &Version) -> crate::Result<()> {
        if self.releases.iter().any(|r| &r.release == wanted) {
            return Ok(());
        }
        let known: Vec<String> = self
            .releases
            .iter()
            .map(|r| r.release.to_string())
            .collect();
        Err(crate::Error::Usage(format!(
            "--release {wanted}: no such PyTorch release in the database; known: {}",
            known.join(", ")
        )))
    }

    /// The database as a table, one build a line; `?` marks unconfirmed values.
    pub fn table(&self, only: Option<&Version>) -> String {
        let db = self;
        let q = |value: String, field: &str, marks: &[String]| {
            if marks.iter().any(|m| m == field) {
                format!("{value}?")
            } else {
                value
            }
        };
        let mut out = format!(
            "{:<6} {:<6} {:<3} {:<10} {:<5} {:<9} {:<11} {:<8} {:<5} {:<4} {:<16} {}\n",
            "torch",
            "build",
            "def",
            "python",
            "cuda",
            "runtime",
            "cudnn",
            "nccl",
            "glibc",
            "abi",
            "archs",
            "driver>="
        );
        for r in db
            .releases
            .iter()
            .filter(|r| only.is_none_or(|v| r.release == *v))
        {
            for v in &r.variants {
                let archs = match (v.archs.first(), v.archs.last()) {
                    (Some(lo), Some(hi)) => {
                        format!("{lo}..{}", hi.to_string().trim_start_matches("sm_"))
                    }
                    _ => String::new(),
                };
                let archs = match v.ptx {
                    Some(Arch { major, minor }) => format!("{archs}+ptx{major}{minor}"),
                    None => archs,
                };
                let floor = db
                    .family_floor(v.cuda.major())
                    .map(|f| format!("{}{}", f.min_driver, if f.unconfirmed { "?" } else { "" }))
                    .unwrap_or_default();
                let opt = |o: &Option<Version>| {
                    o.as_ref()
                        .map(Version::to_string)
                        .unwrap_or_else(|| "-".into())
                };
                let runtime = v.cuda_runtime.clone().unwrap_or_else(|| "-".into());
                out.push_str(&format!(
                    "{:<6} {:<6} {:<3} {:<10} {:<5} {:<9} {:<11} {:<8} {:<5} {:<4} {:<16} {}\n",
                    r.release.to_string(),
                    v.tag,
                    if v.pypi_default { "*" } else { "" },
                    format!(
                        "{}-{}",
                        r.python.first().map(String::as_str).unwrap_or("?"),
                        r.python.last().map(String::as_str).unwrap_or("?")
                    ),
                    v.cuda.to_string(),
                    q(runtime, "cuda_runtime", &v.unconfirmed),
                    q(opt(&v.cudnn), "cudnn", &v.unconfirmed),
                    q(opt(&v.nccl), "nccl", &v.unconfirmed),
                    r.glibc.to_string(),
                    if r.cxx11_abi { "cxx11" } else { "old" },
                    q(archs, "archs", &v.unconfirmed),
                    floor,
                ));
            }
        }
        out.push_str(
            "def: the PyPI default build; ?: not confirmed from the shipped wheel; -: unknown\n",
        );
        out
    }

    /// The database embedded in this binary.
    pub fn embedded() -> &'static Compat {
        static DB: OnceLock<Compat> = OnceLock::new();
        DB.get_or_init(|| {
            let mut db: Compat =
                serde_yaml::from_str(COMPAT_YAML).expect("data/compat.yaml is checked by tests");
            db.gpus = serde_yaml::from_str(GPUS_YAML).expect("data/gpus.yaml is checked by tests");
            db
        })
    }

    /// The minor-version-compatibility floor for a CUDA major.
    pub fn family_floor(&self, cuda_major: u64) -> Option<&DriverFamily> {
        self.drivers
            .families
            .iter()
            .find(|f| f.cuda_major == cuda_major)
    }

    /// The GA driver of a CUDA toolkit minor.
    pub fn toolkit(&self, cuda: &Version) -> Option<&Toolkit> {
        self.drivers
            .toolkits
            .iter()
            .find(|t| t.cuda.major() == cuda.major() && t.cuda.minor() == cuda.minor())
    }

    /// Resolves a GPU name (`h100`) or arch (`sm_90`) to an arch; None if unknown.
    pub fn gpu_arch(&self, name: &str) -> Option<Arch> {
        let wanted = name.trim().to_ascii_lowercase();
        self.gpus
            .iter()
            .find(|f| f.models.contains(&wanted))
            .map(|f| f.arch)
            .or_else(|| name.parse().ok())
    }

    /// How the GPUs of model `name` are linked, when the data says they lack NVLink between
    /// some or all of them; None for NVLink systems and for names that cover both kinds
    /// (`a100` is SXM or PCIe).
    pub fn gpu_links(&self, name: &str) -> Option<GpuLinks> {
        let wanted = name.trim().to_ascii_lowercase();
        self.gpus.iter().find_map(|f| {
            if f.no_nvlink.contains(&wanted) {
                Some(GpuLinks::PcieOnly)
            } else if f.nvlink_bridge.contains(&wanted) {
                Some(GpuLinks::Bridged)
            } else {
                None
            }
        })
    }

    /// Whether model `name` sits on an Arm (aarch64) host.
    pub fn arm_host(&self, name: &str) -> bool {
        let wanted = name.trim().to_ascii_lowercase();
        self.gpus.iter().any(|f| f.arm_hosts.contains(&wanted))
    }

    /// Every known GPU model name.
    pub fn gpu_models(&self) -> impl Iterator<Item = &str> {
        self.gpus
            .iter()
            .flat_map(|f| f.models.iter().map(String::as_str))
    }

    /// Every NCCL version some build pins, oldest first.
    pub fn nccl_versions(&self) -> Vec<Version> {
        let mut all: Vec<Version> = self
            .releases
            .iter()
            .flat_map(|r| r.variants.iter().filter_map(|v| v.nccl.clone()))
            .collect();
        all.sort();
        all.dedup();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_data_is_consistent() {
        let db = Compat::embedded();
        assert_eq!(db.releases.first().unwrap().release, "2.4".parse().unwrap());
        assert_eq!(db.releases.last().unwrap().release, "2.15".parse().unwrap());
        for r in &db.releases {
            let defaults = r.variants.iter().filter(|v| v.pypi_default).count();
            assert_eq!(
                defaults, 1,
                "release {} needs exactly one PyPI default",
                r.release
            );
            for v in &r.variants {
                assert!(
                    !v.archs.is_empty(),
                    "{} {} lists no archs",
                    r.release,
                    v.tag
                );
                assert_eq!(v.tag, format!("cu{}{}", v.cuda.major(), v.cuda.minor()));
                assert!(
                    db.family_floor(v.cuda.major()).is_some(),
                    "no driver floor for {}",
                    v.tag
                );
                for field in &v.unconfirmed {
                    assert!(
                        [
                            "nccl",
                            "cudnn",
                            "cuda_runtime",
                            "cublas",
                            "archs",
                            "requires",
                            "variant"
                        ]
                        .contains(&field.as_str()),
                        "{} {}: unknown unconfirmed mark {field}",
                        r.release,
                        v.tag
                    );
                }
                if v.pypi_default {
                    assert!(
                        v.unconfirmed.is_empty(),
                        "{} default read from the wheel",
                        r.release
                    );
                }
            }
        }
    }

    #[test]
    fn archs_parse_in_every_spelling() {
        let sm90 = Arch { major: 9, minor: 0 };
        for text in ["sm_90", "SM_90a", "compute_90", "9.0", "90"] {
            assert_eq!(text.parse::<Arch>().unwrap(), sm90, "{text}");
        }
        assert_eq!(
            "sm_100".parse::<Arch>().unwrap(),
            Arch {
                major: 10,
                minor: 0
            }
        );
        assert!("h100".parse::<Arch>().is_err());
    }

    #[test]
    fn newer_minor_runs_older_sass_but_not_across_majors() {
        let a = |s: &str| s.parse::<Arch>().unwrap();
        let wheel = [a("sm_80"), a("sm_86"), a("sm_90")];
        assert_eq!(
            coverage(&wheel, None, a("sm_89")),
            Some(Coverage::Sass(a("sm_86")))
        );
        assert_eq!(
            coverage(&wheel, None, a("sm_90")),
            Some(Coverage::Sass(a("sm_90")))
        );
        assert_eq!(coverage(&wheel, None, a("sm_100")), None);
        assert_eq!(
            coverage(&wheel, Some(a("sm_90")), a("sm_100")),
            Some(Coverage::Ptx(a("sm_90")))
        );
        assert_eq!(coverage(&wheel, None, a("sm_70")), None);
    }

    #[test]
    fn gpu_models_resolve_to_archs() {
        let db = Compat::embedded();
        assert_eq!(db.gpu_arch("H100"), Some("sm_90".parse().unwrap()));
        assert_eq!(db.gpu_arch("l40s"), Some("sm_89".parse().unwrap()));
        assert_eq!(db.gpu_arch("sm_103"), Some("sm_103".parse().unwrap()));
        assert_eq!(db.gpu_arch("h1000"), None);
    }

    #[test]
    fn nvlink_lists_name_models_of_their_family() {
        let db = Compat::embedded();
        for f in &db.gpus {
            for m in f.no_nvlink.iter().chain(&f.nvlink_bridge) {
                assert!(f.models.contains(m), "{m} is not a {} model", f.family);
            }
        }
        assert_eq!(db.gpu_links("L40S"), Some(GpuLinks::PcieOnly));
        assert_eq!(db.gpu_links("a100-pcie"), Some(GpuLinks::Bridged));
        assert_eq!(db.gpu_links("a100"), None);
        assert_eq!(db.gpu_links("h100"), None);
    }
}
