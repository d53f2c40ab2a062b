//! A Debian archive client: what `apt-get install --no-install-recommends PKGS` would add to a
//! Debian or Ubuntu base, pinned to files whose hashes a signed archive vouches for.
//!
//! It knows nothing of recipes or locks: it reads an unpacked root ([`sources`],
//! [`status`]), verifies and reads archives ([`release`], [`packages`]) and chooses as apt
//! does ([`solve`]). The chain of trust is apt's: the keyring the source names (or the base
//! trusts) checks the InRelease signature, the InRelease's SHA256 checks the Packages index,
//! the index's SHA256 pins each `.deb`.

mod http;
pub mod maintscript;
pub mod packages;
pub mod release;
pub mod solve;
pub mod sources;
pub mod status;

pub use http::Client;
pub use packages::{Package, PoolFile};
pub use release::{Keyring, Release};
pub use solve::{Ask, Pin, solve};
pub use sources::{Keys, Source};

use crate::error::{Error, Result};
use std::path::Path;

/// What a base already is: its packages, its architecture and where it gets packages from.
#[derive(Clone, Debug)]
pub struct Base {
    /// The installed packages (dpkg status).
    pub installed: Vec<Package>,
    /// dpkg's architecture (`amd64`).
    pub arch: String,
    /// The base's own apt sources.
    pub sources: Vec<Source>,
}

/// Reads the unpacked root `root`: its dpkg status, architecture and apt sources.
pub fn read_base(root: &Path) -> Result<Base> {
    let installed = status::read(root)?;
    let arch = status::native_arch(&installed).ok_or_else(|| {
        Error::Environment(format!(
            "{}: dpkg is not installed in the base, so its architecture is unknown",
            root.display()
        ))
    })?;
    let sources = sources::base_sources(root, &arch)?;
    Ok(Base {
        installed,
        arch,
        sources,
    })
}

/// The archives' packages for `arch` (and `all`), every source's suite verified and every
/// component's index checked, in source order (which breaks ties between equal versions).
pub fn fetch_index(client: &Client, sources: &[Source], arch: &str) -> Result<Vec<Package>> {
    // A suite listed twice (sources.list and a .sources file) is read once, its components
    // merged, as apt does.
    let mut merged: Vec<Source> = Vec::new();
    for s in sources {
        match merged
            .iter_mut()
            .find(|m| m.uri == s.uri && m.suite == s.suite && m.keys == s.keys)
        {
            Some(m) => {
                for c in &s.components {
                    if !m.components.contains(c) {
                        m.components.push(c.clone());
                    }
                }
            }
            None => merged.push(s.clone()),
        }
    }
    let mut out = Vec::new();
    for source in &merged {
        let release = release::fetch(client, source)?;
        for component in &source.components {
            out.extend(packages::fetch(client, &release, component, arch)?);
        }
    }
    Ok(out)
}

/// What installing `asks` into the unpacked base at `root` takes: the base's own sources and
/// `extra` ones (a recipe's), read from the network, then [`solve`]d against the base.
pub fn resolve(client: &Client, root: &Path, extra: &[Source], asks: &[Ask]) -> Result<Vec<Pin>> {
    let base = read_base(root)?;
    let mut all = base.sources.clone();
    all.extend(extra.iter().cloned());
    if all.is_empty() {
        return Err(Error::Usage(format!(
            "{}: the base names no apt source and none was given",
            root.display()
        )));
    }
    let available = fetch_index(client, &all, &base.arch)?;
    solve(&base.installed, &available, asks, &base.arch)
}
