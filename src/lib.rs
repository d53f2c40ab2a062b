//! gpubake builds and certifies container images for GPU training.
//!
//! The data flows recipe -> lock -> image -> probe -> verdict, and the modules stand on floors
//! in that order (tests/layering.rs keeps every import on its floor or below):
//! - foundation: [`error`], [`fsutil`], [`interrupt`], [`document`] (YAML with positions),
//!   [`version`], [`child`], [`units`], [`progress`], [`verdict`] (the check, status and verdict with its
//!   exit code that lint, verify, the probe and certify share), [`nccl`] (NCCL's parameters and
//!   how it parses them),
//!   [`compat`] (the embedded compatibility data), [`cdi`], [`engine`] (the Docker Engine API),
//!   [`net`] (the HTTP agent the wheel cache and the Debian archive client share), [`names`]
//!   (the paths gpubake owns in an image, a Python project's PEP 503 name);
//! - [`image`]: OCI images and nothing of gpubake's own; [`debian`]: a Debian archive client
//!   (apt sources, signed InRelease, Packages, what apt would install into a base);
//! - plan: [`recipe`] reads what a team asks for, [`preset`] layers the NCCL presets and
//!   [`lint`] checks them against [`nccl`], [`resolve`] turns the recipe into a [`lock::Lock`],
//!   [`closure`] and [`wheel`] fix and fetch the Python closure, [`sbom`] describes it;
//! - [`bake`]: a lock into an image (the OS layer of `system:` packages, the Python stack,
//!   the files), daemonless or through a Dockerfile, and reading it back; [`bake::pipeline`]
//!   runs a whole build request, from the recipe to the image and what is written beside it;
//! - run: [`runtime`] runs an image under an OCI runtime with CDI devices, [`probe`] checks a
//!   node and its GPUs;
//! - [`certify`]: the verdict on an image;
//! - [`cmd`]: one module per subcommand, each a thin shell over the floors below.
#![deny(missing_docs)]

pub mod bake;
pub mod cdi;
pub mod certify;
pub mod child;
pub mod closure;
pub mod cmd;
pub mod compat;
pub mod debian;
pub mod document;
pub mod engine;
pub mod error;
pub mod fsutil;
pub mod image;
pub mod interrupt;
pub mod lint;
pub mod lock;
pub mod names;
pub mod nccl;
pub mod net;
pub mod preset;
pub mod probe;
pub mod progress;
pub mod recipe;
pub mod resolve;
pub mod runtime;
pub mod sbom;
pub mod sign;
pub mod startup;
pub mod units;
pub mod verdict;
pub mod version;
pub mod wheel;

pub use error::{Error, Result};
