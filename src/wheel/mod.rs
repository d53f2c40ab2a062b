//! Wheels: fetched once into a content-addressed cache ([`cache`]), then installed without
//! pip, uv or a container, straight into image layer entries ([`install`]).
//!
//! The closure ([`crate::closure`]) names every wheel by URL, size and sha256; the cache
//! makes those files available and verified; the installer maps each wheel's files onto the
//! image's install [`install::Scheme`] as the binary distribution format specifies.

pub mod cache;
pub mod install;
pub mod tags;
