//! gpubake builds and certifies container images for GPU training.
//!
//! The data flows recipe -> lock -> image -> probe -> verdict; each arrow is a plain function
//! over plain data, and the CLI is a thin shell over them:
//! - [`recipe`] reads what a team asks for, [`resolve`] turns it into a [`lock::Lock`] using
//!   the embedded [`compat`] database and the layered NCCL [`preset`]s;
//! - [`nccl`] holds what gpubake knows about NCCL (its parameters and how it parses them);
//!   [`lint`] checks NCCL settings against it;
//! - [`render`] writes a Dockerfile from a lock.
#![deny(missing_docs)]

pub mod bake;
pub mod cdi;
pub mod certify;
pub mod child;
pub mod closure;
pub mod cmd;
pub mod compat;
pub mod document;
pub mod engine;
pub mod error;
pub mod fsutil;
pub mod image;
pub mod interrupt;
pub mod lint;
pub mod lock;
pub mod nccl;
pub mod preset;
pub mod probe;
pub mod recipe;
pub mod resolve;
pub mod runtime;
pub mod sbom;
pub mod units;
pub mod version;
pub mod wheel;

pub use error::{Error, Result};
