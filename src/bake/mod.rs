//! Baking: what makes a gpubake image of a lock, above the OCI library ([`crate::image`]) and
//! below the probe and certify. The plan of a build and its layers (the base, the Python
//! stack streamed from wheels, the probe, presets, files), the daemonless build itself, the
//! Dockerfile path for an engine's builder (the same contents), and the reading of a gpubake
//! image back (`inspect`, `verify`). A [`request::Request`] runs the whole of `gpubake build`
//! through [`pipeline::run`]: the recipe resolved and linted, the closures, the image, and the
//! lock, SBOM and signed provenance beside it.

pub mod build;
pub mod fs;
pub mod gc;
pub mod inspect;
pub mod locking;
pub mod outputs;
pub mod pipeline;
pub mod prefetch;
pub mod provenance;
pub mod render;
pub mod report;
pub mod request;
pub mod scripts;
pub mod stack;
pub mod system;

/// How a layer made of fetched artifacts (wheels, .debs) is written.
#[derive(Clone)]
pub struct LayerOptions<'a> {
    /// The layer's compression.
    pub compression: crate::image::layer::Compression,
    /// Every timestamp in it.
    pub epoch: u64,
    /// Whether a layer built before from the same inputs may be reused.
    pub use_cache: bool,
    /// The content-addressed cache the artifacts are fetched into.
    pub cache: &'a crate::wheel::cache::WheelCache,
    /// How they may be fetched (`--offline`: from the cache only).
    pub fetch: crate::wheel::cache::FetchOptions,
    /// The engine the layers stream to, when it is the destination: they go there instead
    /// of into the store, uncompressed (see [`crate::image::stream`]).
    pub engine: Option<&'a crate::image::stream::EngineStream>,
    /// A registry's layer cache (`--cache-from`), asked for layers the local cache lacks.
    pub registry: Option<&'a dyn crate::image::layer::RegistryLayers>,
}

impl<'a> LayerOptions<'a> {
    /// Where the layers go: `store`, or the engine, with the caches these options allow.
    pub fn sink(&self, store: &'a crate::image::layout::Layout) -> crate::image::layer::Target<'a> {
        crate::image::layer::Target {
            layout: store,
            compression: self.compression,
            epoch: self.epoch,
            use_cache: self.use_cache,
            engine: self.engine,
            registry: self.registry,
        }
    }
}

pub use build::{BuildOptions, BuildReport, Plan, PlatformOptions, build, build_for, build_probe};
