//! Another image's layers as eStargz or zstd:chunked: a base under `build --compression
//! estargz` (or `zstd:chunked`), and any image under `copy --compression`. A node that pulls
//! lazily mounts every layer of such an image; containerd fetches every layer above the
//! first one it cannot mount, so one plain layer would make the whole image a full pull.

use super::Platform;
use super::layer::Compression;
use super::layout::Layout;
use super::model::Image;
use crate::error::{Error, Result};
use oci_spec::image::{Descriptor, ImageManifestBuilder, MediaType};
use serde_json::{Value, json};

/// `image`'s layers as `compression` (eStargz or zstd:chunked) in `store`: each layer that
/// is not so already is rewritten ([`super::layer::to_lazy`], cached by its digest unless
/// `use_cache` is false), one that is keeps its blob, copied into `store` when it is
/// elsewhere; `config`'s diff IDs follow.
pub fn lazy_layers(
    image: &Image,
    store: &Layout,
    compression: Compression,
    config: &mut Value,
    use_cache: bool,
) -> Result<Vec<Descriptor>> {
    let mut layers = Vec::new();
    let mut diff_ids = super::model::strings(&config["rootfs"]["diff_ids"]);
    for (i, layer) in image.layers().iter().enumerate() {
        let descriptor = layer.descriptor();
        let already = descriptor.media_type() == &compression.media_type()
            && descriptor
                .annotations()
                .as_ref()
                .is_some_and(|a| a.contains_key(super::estargz::TOC_DIGEST));
        if already {
            let digest = layer.digest()?;
            if !store.has_blob(&digest, layer.size()) {
                let mut w = store.blob_writer()?;
                std::io::copy(&mut layer.compressed()?, &mut w)
                    .map_err(|e| Error::image(image.describe(), e.to_string()))?;
                w.commit()?;
            }
            layers.push(layer.descriptor().clone());
            continue;
        }
        let rewritten = super::layer::to_lazy(store, layer, compression, use_cache)?;
        if let Some(id) = diff_ids.get_mut(i) {
            *id = rewritten.diff_id.to_string();
        }
        layers.push(rewritten.descriptor);
    }
    config["rootfs"]["diff_ids"] = json!(diff_ids);
    Ok(layers)
}

/// `image` with every layer as `compression` (eStargz or zstd:chunked), written into
/// `store`: its config with the new diff IDs, an OCI manifest with the manifest's
/// annotations, the descriptor with its platform. The layers are cached by their source's
/// digest, so converting an image again reads nothing but what changed.
pub fn lazy_image(image: &Image, store: &Layout, compression: Compression) -> Result<Image> {
    let name = image.describe();
    let mut config: Value = serde_json::from_slice(&image.config_bytes()?)
        .map_err(|e| Error::image(&name, format!("config: {e}")))?;
    let layers = lazy_layers(image, store, compression, &mut config, true)?;
    let config = store.write_json(&config, MediaType::ImageConfig)?;
    let mut manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config)
        .layers(layers);
    if let Some(annotations) = image.manifest().annotations() {
        manifest = manifest.annotations(annotations.clone());
    }
    let manifest = manifest
        .build()
        .map_err(|e| Error::image(&name, e.to_string()))?;
    let mut desc = store.write_json(&manifest, MediaType::ImageManifest)?;
    desc.set_platform(image.descriptor().platform().clone());
    let platform = image.platform()?.unwrap_or_else(Platform::host);
    Image::in_layout(store.clone(), &desc, &platform, None)
}
