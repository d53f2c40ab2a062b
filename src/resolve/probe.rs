//! A probe recipe (`pytorch: none`) resolved. Nothing is pinned, so there is no lock: the
//! image gets the recipe's presets and `env:`, the NVIDIA variables the container toolkit
//! reads, and labels naming the recipe and the gpubake that built it.

use super::{Options, load_layers, merge_env};
use crate::error::Result;
use crate::lock::{BASE_NAME, KIND_LABEL, PROBE_KIND, VERSION_LABEL};
use crate::preset::{MergedEnv, Preset};
use crate::recipe::LoadedRecipe;
use indexmap::IndexMap;

/// What a probe image is made of besides its base and the probe binary.
pub struct ProbeImage {
    /// The recipe's name.
    pub name: String,
    /// The base image, as the recipe's `base:` names it.
    pub base: String,
    /// The platforms to build, as the recipe's `platforms:` names them (linux/amd64 when it
    /// names none).
    pub platforms: Vec<String>,
    /// The merged presets with the recipe's `env:` on top (empty without either).
    pub env: MergedEnv,
    /// The preset layers merged, in order.
    pub layers: Vec<Preset>,
    /// The image's labels.
    pub labels: IndexMap<String, String>,
}

/// Reads a probe recipe's presets and makes its labels.
pub fn resolve_probe(loaded: &LoadedRecipe, opts: &Options) -> Result<ProbeImage> {
    let recipe = &loaded.recipe;
    loaded.file_sources()?;
    let layers = load_layers(loaded, opts)?;
    let env = merge_env(loaded, &layers);
    let mut labels = IndexMap::new();
    labels.insert(
        "org.opencontainers.image.title".to_string(),
        recipe.name.clone(),
    );
    if let Some(d) = &recipe.description {
        labels.insert("org.opencontainers.image.description".into(), d.clone());
    }
    labels.insert(BASE_NAME.to_string(), recipe.base.clone());
    labels.insert("io.gpubake.recipe.sha256".into(), loaded.doc.sha256());
    // With no lock in the image, the label is where the probe's version is read from.
    labels.insert(VERSION_LABEL.into(), env!("CARGO_PKG_VERSION").into());
    labels.insert(KIND_LABEL.into(), PROBE_KIND.into());
    for (k, v) in &recipe.labels.0 {
        labels.insert(k.clone(), v.clone());
    }
    Ok(ProbeImage {
        name: recipe.name.clone(),
        base: recipe.base.clone(),
        platforms: recipe.platforms().iter().map(ToString::to_string).collect(),
        env,
        layers,
        labels,
    })
}

impl ProbeImage {
    /// Every environment variable the image sets: the merged presets, then the NVIDIA ones.
    /// There is no `NVIDIA_REQUIRE_CUDA`: the toolkit would refuse to start the container
    /// on a node whose driver is too old, the very node the probe is there to report on.
    pub fn image_env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .env
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v.value.clone()))
            .collect();
        env.push(("NVIDIA_VISIBLE_DEVICES".into(), "all".into()));
        // compute brings libcuda, utility NVML: the two libraries the probe opens.
        env.push((
            "NVIDIA_DRIVER_CAPABILITIES".into(),
            "compute,utility".into(),
        ));
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::Document;

    #[test]
    fn a_probe_recipe_gets_labels_and_the_toolkits_variables_but_no_cuda_requirement() {
        let doc = Document::from_text(
            "probe.yaml",
            "name: gpu-probe\nbase: debian:bookworm\npytorch: none\nlabels: {team: infra}\n",
        );
        let loaded = LoadedRecipe::parse(doc).unwrap();
        let probe = resolve_probe(&loaded, &Options::default()).unwrap();
        assert_eq!(probe.platforms, ["linux/amd64"]);
        assert_eq!(probe.labels[VERSION_LABEL], env!("CARGO_PKG_VERSION"));
        assert_eq!(probe.labels[KIND_LABEL], PROBE_KIND);
        assert_eq!(probe.labels["team"], "infra");
        let env = probe.image_env();
        assert!(env.contains(&("NVIDIA_VISIBLE_DEVICES".into(), "all".into())));
        assert!(!env.iter().any(|(k, _)| k == "NVIDIA_REQUIRE_CUDA"));
        // It has nothing to resolve: resolve_recipe says so at the field.
        let err = super::super::resolve_recipe(&loaded, &Options::default())
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("probe.yaml:3:10: field `pytorch`"), "{err}");
    }
}
