//! OCI images, and nothing of gpubake's own above them: the image model, layouts, archives,
//! the Docker Engine and registries as transports, layers (written reproducibly), digests,
//! referrers, unpacking, and the static link closure of an unpacked root. Blobs are
//! content-addressed and checked whenever read. What makes a gpubake image of a lock is
//! [`crate::bake`], one floor up.

pub mod archive;
pub mod convert;
pub mod digest;
pub mod estargz;
pub mod gc;
mod insecure;
pub mod layer;
pub mod layercache;
pub mod layout;
pub mod ldcache;
pub mod links;
pub mod model;
pub mod plugins;
pub mod referrers;
pub mod registry;
pub mod sbom;
pub mod scan;
pub mod signature;
pub mod stream;
pub mod streamcheck;
pub mod tarstream;
pub mod transport;
pub mod unpack;
mod wire;

pub use layer::Compression;
pub use model::{Image, IndexImage, Layer, Platform};
pub use transport::Transport;

/// What `inspect` and `copy` say beside a manifest digest that gpubake made.
pub const MADE_HERE: &str = " (made by gpubake from Docker's manifest.json: the source holds \
     no manifest, and other tools make their own; the image ID, the config's digest, is the \
     same in all)";
