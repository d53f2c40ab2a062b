//! What a layout or gpubake's cache holds that nothing needs, found and removed under the
//! locks that keep live builds out: `gpubake gc`.

use crate::error::{Error, Result};
use crate::image::gc::{Garbage, Roots};
use crate::image::layout::Layout;
use crate::interrupt::Leftovers;
use std::path::{Path, PathBuf};

/// What is collected.
#[derive(Debug, Clone)]
pub enum Target {
    /// An OCI layout: what its `index.json` does not reach.
    Layout(PathBuf),
    /// gpubake's cache at this root: leftovers, and the layer cache's blobs nothing names.
    Cache(PathBuf),
}

/// What was found (and, unless a dry run, removed).
#[derive(Debug, Default)]
pub struct Collected {
    /// In the layout, or the cache's layout.
    pub garbage: Garbage,
    /// Interrupted wheel downloads and temporary files of the wheel cache.
    pub wheels: Leftovers,
}

impl Collected {
    /// The bytes in all.
    pub fn bytes(&self) -> u64 {
        self.garbage.bytes() + self.wheels.bytes()
    }

    /// Every path, each with its size and what it is, in the order removed.
    pub fn items(&self) -> Vec<(&'static str, &Path, u64)> {
        let g = &self.garbage;
        let temp = g
            .temp
            .files
            .iter()
            .map(|(p, s)| ("temporary file", p.as_path(), *s));
        let records = g.records.iter().map(|p| ("record", p.as_path(), 0));
        let blobs = g
            .blobs
            .iter()
            .map(|(p, s)| ("unreferenced blob", p.as_path(), *s));
        let damaged = g
            .damaged
            .iter()
            .map(|(p, s)| ("damaged blob", p.as_path(), *s));
        let wheels = self.wheels.files.iter().map(|(p, s)| {
            let kind = if p.extension().is_some_and(|x| x == "part") {
                "interrupted download"
            } else {
                "temporary file"
            };
            (kind, p.as_path(), *s)
        });
        temp.chain(records)
            .chain(blobs)
            .chain(damaged)
            .chain(wheels)
            .collect()
    }
}

/// Finds what `target` holds that nothing needs and, unless `dry_run`, removes it. Waits for
/// the builds writing the layout (or using the cache) to finish first.
pub fn collect(target: &Target, dry_run: bool) -> Result<Collected> {
    match target {
        Target::Layout(dir) => {
            let layout = Layout::open(dir)?;
            let _lock = layout.lock_as_found()?;
            let garbage = crate::image::gc::garbage(&layout, Roots::Index)?;
            if !dry_run {
                garbage.remove()?;
            }
            Ok(Collected {
                garbage,
                wheels: Leftovers::default(),
            })
        }
        Target::Cache(root) => {
            if !root.is_dir() {
                // The OS's own words ("No such file or directory"), not the kind's name.
                return Err(Error::reading(
                    root,
                    std::io::Error::from_raw_os_error(libc::ENOENT),
                ));
            }
            let mut found = Collected::default();
            let dir = root.join("layout");
            if dir.join("oci-layout").is_file() {
                let layout = Layout::open(&dir)?;
                let _users = layout.lock_cache_users()?;
                let _lock = layout.lock_as_found()?;
                found.garbage =
                    crate::image::gc::garbage(&layout, Roots::IndexManifestsAndRecords)?;
                if !dry_run {
                    found.garbage.remove()?;
                }
            }
            if root.join("wheels").is_dir() {
                found.wheels = crate::wheel::cache::WheelCache::open(root.clone())?.leftovers();
                if !dry_run {
                    found
                        .wheels
                        .remove()
                        .map_err(|(path, e)| Error::writing(path, e))?;
                }
            }
            Ok(found)
        }
    }
}
