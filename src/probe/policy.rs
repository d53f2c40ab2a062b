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
    }
}
