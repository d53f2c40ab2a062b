//! Baking: what makes a gpubake image of a lock, above the OCI library ([`crate::image`]) and
//! below the probe and certify. The plan of a build and its layers (the base, the Python
//! stack streamed from wheels, the probe, presets, files), the daemonless build itself, the
//! Dockerfile path for an engine's builder (the same contents), and the reading of a gpubake
//! image back (`inspect`, `verify`).

pub mod build;
pub mod fs;
pub mod inspect;
pub mod render;
pub mod stack;
pub mod system;

pub use build::{BuildOptions, BuildReport, PlatformOptions, build, build_for};
