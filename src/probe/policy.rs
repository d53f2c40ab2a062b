//! Expected floors per GPU model (`data/policy.yaml`), embedded, or from `--policy FILE`.

use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

const POLICY_YAML: &str = include_str!("../../data/policy.yaml");

/// PCIe link a healthy card trains to under load.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pcie {
    /// Generation.
    #[serde(rename = "gen")]
    pub generation: u32,
    /// Lanes.
    pub width: u32,
}

/// One model's expectations.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelPolicy {
    /// Substring of the NVML device name.
    #[serde(rename = "match")]
    pub pattern: String,
    /// A readable model name.
    pub model: String,
    /// The model names of `data/gpus.yaml` (as recipes write them under `gpus:`) this entry
    /// covers. Only the shipped policy needs them: a test holds every recipe to a floor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// How GPUs of this model talk to each other: `nvlink` or `pcie`.
    pub link: String,
    /// Expected PCIe link.
    pub pcie: Pcie,
    /// NVLink links expected up.
    pub nvlink_links: u32,
    /// Device memory copy bandwidth floor, GB/s (read + write).
    pub memory_gbps_floor: f64,
    /// GPU-to-GPU copy bandwidth floor, GB/s, one direction.
    pub p2p_gbps_floor: f64,
    /// Dense bf16 GEMM floor for the image's own torch, TFLOP/s; unjudged where absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_tflops_floor: Option<f64>,
}

/// The floors of the policy file at `path` (YAML like data/policy.yaml), for `probe --policy`.
pub fn read(path: &std::path::Path) -> crate::error::Result<Vec<ModelPolicy>> {
    let doc = crate::document::Document::read(path)?;
    doc.parse::<Vec<ModelPolicy>>("policy", |_| {
        Some("a list of {match, model, link, pcie: {gen, width}, nvlink_links, memory_gbps_floor, p2p_gbps_floor}".into())
    })
}

/// The embedded policy as it is written (data/policy.yaml), for a certificate to name it by
/// digest.
pub fn embedded_yaml() -> &'static str {
    POLICY_YAML
}

/// The embedded policy.
pub fn embedded() -> &'static [ModelPolicy] {
    static POLICY: OnceLock<Vec<ModelPolicy>> = OnceLock::new();
    POLICY.get_or_init(|| {
        serde_yaml::from_str(POLICY_YAML).expect("data/policy.yaml is checked by tests")
    })
}

/// The entry whose pattern is the longest substring of `name`.
pub fn for_gpu<'a>(policy: &'a [ModelPolicy], name: &str) -> Option<&'a ModelPolicy> {
    policy
        .iter()
        .filter(|p| name.contains(&p.pattern))
        .max_by_key(|p| p.pattern.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_specific_entry_wins() {
        let p = embedded();
        assert_eq!(for_gpu(p, "NVIDIA H200").unwrap().model, "H200 SXM");
        assert_eq!(for_gpu(p, "NVIDIA H200 NVL").unwrap().model, "H200 NVL");
        assert_eq!(
            for_gpu(p, "NVIDIA H100 80GB HBM3").unwrap().model,
            "H100 SXM"
        );
        assert_eq!(for_gpu(p, "NVIDIA H100 PCIe").unwrap().model, "H100 PCIe");
        assert!(for_gpu(p, "Tesla T4").is_none());
        assert_eq!(
            for_gpu(p, "NVIDIA A100-SXM4-80GB").unwrap().model,
            "A100 SXM 80GB"
        );
        assert_eq!(
            for_gpu(p, "NVIDIA A100-SXM4-40GB").unwrap().model,
            "A100 SXM 40GB"
        );
        assert_eq!(
            for_gpu(p, "NVIDIA A100-PCIE-40GB").unwrap().model,
            "A100 PCIe 40GB"
        );
        assert_eq!(
            for_gpu(p, "NVIDIA A100 80GB PCIe").unwrap().model,
            "A100 PCIe 80GB"
        );
        assert_eq!(for_gpu(p, "NVIDIA L40S").unwrap().model, "L40S");
        assert_eq!(for_gpu(p, "NVIDIA B200").unwrap().model, "B200");
    }

    /// Every floor is a positive number and every link kind is one the checks know.
    #[test]
    fn every_entry_can_fail() {
        for p in embedded() {
            assert!(p.memory_gbps_floor > 0.0, "{}", p.model);
            assert!(p.p2p_gbps_floor > 0.0, "{}", p.model);
            assert!(p.pcie.generation > 0 && p.pcie.width > 0, "{}", p.model);
            assert!(["nvlink", "pcie"].contains(&p.link.as_str()), "{}", p.model);
            assert_eq!(p.link == "nvlink", p.nvlink_links > 0, "{}", p.model);
        }
    }

    /// A recipe for a GPU model the policy does not know would be certified without any floor:
    /// every model a shipped recipe names (or, for an `sm_` arch, some model of that arch) must
    /// be covered by an entry, and every name an entry lists must be a model of data/gpus.yaml.
    #[test]
    fn every_recipe_gpu_has_a_floor() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let catalog: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(root.join("data/gpus.yaml")).unwrap())
                .unwrap();
        // (arch, model) for every model data/gpus.yaml knows.
        let models: Vec<(String, String)> = catalog
            .as_sequence()
            .unwrap()
            .iter()
            .flat_map(|family| {
                let arch = family["arch"].as_str().unwrap().to_string();
                family["models"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(move |m| (arch.clone(), m.as_str().unwrap().to_string()))
            })
            .collect();
        let covered: Vec<&str> = embedded()
            .iter()
            .flat_map(|p| p.gpus.iter().map(String::as_str))
            .collect();
        for name in &covered {
            assert!(
                models.iter().any(|(_, m)| m == name),
                "policy names `{name}`, which data/gpus.yaml does not know"
            );
        }
        let mut recipes = 0;
        for entry in std::fs::read_dir(root.join("recipes")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            recipes += 1;
            let recipe: serde_yaml::Value =
                serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let gpus = recipe["gpus"].as_sequence().cloned().unwrap_or_default();
            assert!(!gpus.is_empty(), "{} names no GPU", path.display());
            for gpu in gpus {
                let gpu = gpu.as_str().unwrap().to_ascii_lowercase();
                let ok = if gpu.starts_with("sm_") {
                    models
                        .iter()
                        .any(|(arch, m)| *arch == gpu && covered.contains(&m.as_str()))
                } else {
                    covered.contains(&gpu.as_str())
                };
                assert!(
                    ok,
                    "{} names `{gpu}`, but data/policy.yaml has no floor for it: add an entry with its datasheet figures",
                    path.display()
                );
            }
        }
        assert!(recipes >= 5, "the shipped recipes were not found");
    }
}
