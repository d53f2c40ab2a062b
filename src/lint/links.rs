//! Settings that only make sense on some hardware, checked against the GPUs a recipe names.

use super::{Issue, Severity};
use crate::compat::{Compat, GpuLinks};
use crate::nccl::value::{PathLevel, path_level};

/// NCCL_P2P_LEVEL=NVL (or NVB) on GPUs that lack NVLink. NCCL connects a GPU pair peer-to-peer
/// only when their path is no farther than the level (`ncclTopoCheckP2p` in
/// src/graph/paths.cc); a pair it refuses goes to the next transport, shared host memory
/// (`shmCanConnect` in src/transport/shm.cc).
pub(super) fn check_links(name: &str, value: &str, gpus: &[String]) -> Option<Issue> {
    let PathLevel::Name(level @ ("NVL" | "NVB")) = path_level(value) else {
        return None;
    };
    if name != "NCCL_P2P_LEVEL" {
        return None;
    }
    let db = Compat::embedded();
    let having = |links| {
        gpus.iter()
            .filter(|g| db.gpu_links(g) == Some(links))
            .map(String::as_str)
            .collect::<Vec<_>>()
    };
    let (pcie_only, bridged) = (having(GpuLinks::PcieOnly), having(GpuLinks::Bridged));
    let rule = format!(
        "NCCL_P2P_LEVEL={level} lets NCCL connect two GPUs peer-to-peer only over an NVLink path"
    );
    let fallback = "through host memory (NCCL's SHM transport) instead of peer-to-peer over \
                    PCIe, which NCCL would otherwise use between GPUs that share PCIe switches";
    if !pcie_only.is_empty() {
        return Some(Issue {
            severity: Severity::Error,
            code: "no-nvlink",
            message: format!(
                "{} {} no NVLink: {rule}, so NCCL finds none and sends every GPU pair {fallback}",
                pcie_only.join(", "),
                if pcie_only.len() == 1 { "has" } else { "have" },
            ),
            help: Some(
                "use the `pcie` preset (NCCL_P2P_LEVEL=PXB) or leave NCCL_P2P_LEVEL unset".into(),
            ),
        });
    }
    (!bridged.is_empty()).then(|| Issue {
        severity: Severity::Warning,
        code: "nvlink-bridge",
        message: format!(
            "{} {} NVLink only between the cards a bridge joins: {rule}, so every pair without \
             a bridge goes {fallback}",
            bridged.join(", "),
            if bridged.len() == 1 { "has" } else { "have" },
        ),
        help: Some(
            "leave NCCL_P2P_LEVEL unset (or PXB) unless every GPU pair in the node is bridged"
                .into(),
        ),
    })
}
