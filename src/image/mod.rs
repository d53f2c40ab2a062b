//! Images: daemonless, reproducible OCI builds from a lock and a base image, and the reading
//! side (`inspect`, `verify`). Blobs are content-addressed and checked whenever read.

pub mod archive;
pub mod build;
pub mod digest;
pub mod fs;
mod insecure;
pub mod inspect;
pub mod layer;
pub mod layout;
pub mod links;
pub mod model;
pub mod referrers;
pub mod registry;
pub mod sbom;
pub mod stack;
pub mod tarstream;
pub mod transport;
pub mod unpack;
mod wire;

pub use build::{BuildOptions, BuildReport, PlatformOptions, build, build_for};
pub use layer::Compression;
pub use model::{Image, IndexImage, Layer, Platform};
pub use transport::Transport;
