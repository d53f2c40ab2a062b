//! What gpubake calls things, below every stage that speaks of them: the paths it owns in an
//! image, which the recipe keeps free, the bake writes and the probe reads, and a Python
//! project's name as PEP 503 normalises it, which the recipe, the closure, the bake and the
//! SBOM compare by.

/// Where the probe binary is stored in the image.
pub const PROBE_PATH_IN_IMAGE: &str = "/usr/local/bin/gpubake";

/// The virtual environment the stack is installed into.
pub const VENV: &str = "/opt/gpubake/venv";

/// PEP 503 names: case and runs of `-_.` do not matter.
pub fn normalize(name: &str) -> String {
    let mut out = String::new();
    let mut dash = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            dash = true;
        } else {
            if dash && !out.is_empty() {
                out.push('-');
            }
            dash = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize_as_pep_503_says() {
        assert_eq!(normalize("Nvidia_NCCL.cu12"), "nvidia-nccl-cu12");
        assert_eq!(normalize("typing--extensions"), "typing-extensions");
    }
}
