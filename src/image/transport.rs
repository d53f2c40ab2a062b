//! Image references in skopeo's transport syntax, which users already know:
//! `oci:DIR[:TAG]`, `docker-archive:FILE[:NAME:TAG]`, `docker-daemon:NAME:TAG`,
//! `docker://REGISTRY/NAME:TAG`; and the sources and sinks behind them: [`Transport::open`]
//! reads an [`Image`] from any of them and [`Transport::write`] writes one to any of them.

use super::archive;
use super::digest::Digest;
use super::layout::Layout;
use super::model::{Image, IndexImage, Platform, is_index};
use super::registry::{self, Access, Remote};
use crate::error::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where an image is read from or written to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// An OCI image layout directory, with an optional tag.
    Oci {
        /// The layout directory.
        dir: PathBuf,
        /// The `org.opencontainers.image.ref.name` to read or write.
        tag: Option<String>,
    },
    /// A tar file as `docker save` writes it, loadable with `docker load`.
    DockerArchive {
        /// The archive.
        path: PathBuf,
        /// The `NAME:TAG` recorded in it.
        reference: Option<String>,
    },
    /// An image in a Docker Engine.
    DockerDaemon(String),
    /// An image in a registry.
    Registry(Remote),
}

impl FromStr for Transport {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        if let Some(rest) = text.strip_prefix("oci:") {
            // The tag follows the last colon, unless that colon belongs to a path component.
            let (dir, tag) = match rest.rsplit_once(':') {
                Some((dir, tag)) if !tag.contains('/') && !dir.is_empty() => {
                    (dir, Some(tag.to_string()))
                }
                _ => (rest, None),
            };
            if dir.is_empty() {
                return Err(Error::Usage(format!(
                    "`{text}`: oci: needs a directory, as in oci:./image:latest"
                )));
            }
            if let Some(tag) = tag.as_deref().filter(|t| !t.is_empty() && !is_ref_name(t)) {
                return Err(Error::Usage(format!(
                    "`{text}`: `{tag}` is not a tag an OCI layout may hold: letters and digits, \
                     separated by one of `.` `_` `-` `+` `:` `@` or by `--` (and `/` between \
                     parts), as in oci:./image:v1.2"
                )));
            }
            return Ok(Transport::Oci {
                dir: PathBuf::from(dir),
                tag: tag.filter(|t| !t.is_empty()),
            });
        }
        if let Some(rest) = text.strip_prefix("docker-archive:") {
            let (path, reference) = match rest.split_once(':') {
                Some((p, r)) => (p, Some(r.to_string())),
                None => (rest, None),
            };
            if path.is_empty() {
                return Err(Error::Usage(format!(
                    "`{text}`: docker-archive: needs a file"
                )));
            }
            if let Some(name) = &reference {
                docker_name(text, name)?;
            }
            return Ok(Transport::DockerArchive {
                path: PathBuf::from(path),
                reference,
            });
        }
        if let Some(rest) = text.strip_prefix("docker-daemon:") {
            // An image ID (`sha256:HEX`) names an image to read; anything else is a name.
            if !rest.is_empty() && rest.parse::<super::digest::Digest>().is_err() {
                docker_name(text, rest)?;
            }
            return Ok(Transport::DockerDaemon(rest.to_string()));
        }
        if let Some(rest) = text.strip_prefix("docker://") {
            if rest.is_empty() {
                return Err(Error::Usage(format!(
                    "`{text}`: docker:// needs an image, as in docker://REGISTRY/NAME:TAG"
                )));
            }
            let remote = Remote {
                reference: rest.to_string(),
                access: Access::default(),
            };
            remote.parsed()?;
            return Ok(Transport::Registry(remote));
        }
        // A word before a colon that is no path (`containers-storage:img`) names a transport
        // gpubake does not have; anything else is a path, and a path is an OCI layout, the
        // default the help promises.
        if let Some((scheme, _)) = text.split_once(':')
            && !scheme.is_empty()
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'+')
            && !Path::new(scheme).exists()
        {
            return Err(Error::Usage(format!(
                "`{text}`: `{scheme}:` is not a transport gpubake reads or writes; use a \
                 directory (an OCI layout), oci:DIR[:TAG], docker-archive:FILE[:NAME:TAG], \
                 docker-daemon:NAME:TAG or docker://REGISTRY/NAME:TAG"
            )));
        }
        format!("oci:{text}").parse()
    }
}

/// True for a tag as the OCI image layout's `org.opencontainers.image.ref.name` grammar has
/// it (which skopeo enforces): `/`-separated parts, each letters and digits joined by one of
/// `-._:@+` or by `--`.
fn is_ref_name(tag: &str) -> bool {
    tag.split('/').all(|part| {
        let alphanum = |c: char| c.is_ascii_alphanumeric();
        let mut rest = part;
        loop {
            let run = rest.find(|c: char| !alphanum(c)).unwrap_or(rest.len());
            if run == 0 {
                return false;
            }
            rest = &rest[run..];
            if rest.is_empty() {
                return true;
            }
            rest = match rest.strip_prefix("--") {
                Some(r) => r,
                None if rest.starts_with(['-', '.', '_', ':', '@', '+']) => &rest[1..],
                None => return false,
            };
        }
    })
}

/// Refuses a `NAME[:TAG]` that Docker would refuse (uppercase, stray characters), before
/// anything is read or built.
fn docker_name(text: &str, name: &str) -> Result<()> {
    name.parse::<oci_client::Reference>()
        .map(|_| ())
        .map_err(|e| {
            Error::Usage(format!(
                "`{text}`: `{name}` is not an image name Docker takes ({e}); write NAME:TAG \
                 in lowercase, as in train:v1"
            ))
        })
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Oci { dir, tag: Some(t) } => write!(f, "oci:{}:{t}", dir.display()),
            Transport::Oci { dir, tag: None } => write!(f, "oci:{}", dir.display()),
            Transport::DockerArchive {
                path,
                reference: Some(r),
            } => write!(f, "docker-archive:{}:{r}", path.display()),
            Transport::DockerArchive {
                path,
                reference: None,
            } => write!(f, "docker-archive:{}", path.display()),
            Transport::DockerDaemon(r) => write!(f, "docker-daemon:{r}"),
            Transport::Registry(r) => write!(f, "docker://{}", r.reference),
        }
    }
}

impl Transport {
    /// The image as an in-toto statement's subject names it: `registry/repository:tag` for a
    /// registry image, as cosign writes it; the transport as written for the others.
    pub fn subject_name(&self) -> String {
        match self {
            Transport::Registry(remote) => remote.reference.clone(),
            other => other.to_string(),
        }
    }

    /// Whether this is the registry image that `reference` (a recipe's `base:`) names, as
    /// docker names images (`debian:bookworm` is docker.io/library/debian:bookworm): only
    /// then does that reference say where the image came from.
    pub fn is_registry_reference(&self, reference: &str) -> bool {
        let whole = |t: &Transport| match t {
            Transport::Registry(remote) => remote.parsed().ok().map(|r| r.whole()),
            _ => None,
        };
        let named = Transport::of_base(reference).ok();
        whole(self).is_some_and(|b| named.as_ref().and_then(whole) == Some(b))
    }

    /// This transport as the place an image is written to: a registry reference by digest
    /// and an engine's image ID name what exists and are refused (exit 2), before any work.
    pub fn destination(self) -> Result<Self> {
        match &self {
            Transport::Registry(remote) if remote.parsed()?.digest().is_some() => {
                Err(Error::Usage(format!(
                    "docker://{}: an image is written to a tag, not a digest (the digest \
                     is what the registry computes from the manifest); write \
                     docker://REGISTRY/NAME:TAG",
                    remote.reference
                )))
            }
            Transport::DockerDaemon(id) if id.parse::<super::digest::Digest>().is_ok() => {
                Err(Error::Usage(format!(
                    "docker-daemon:{id}: an image ID names an image the engine has; write \
                     docker-daemon:NAME:TAG"
                )))
            }
            _ => Ok(self),
        }
    }

    /// A recipe's `base:` as a transport. One written with a transport (`oci:DIR:TAG`,
    /// `docker-archive:FILE`, `docker-daemon:NAME:TAG`, `docker://…`) is that; a plain image
    /// reference (`nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04`,
    /// `registry.example:5000/team/base:1`) is a registry image, named as docker names it:
    /// the first part is a registry when it has a `.` or a `:` or is `localhost`, else the
    /// image is on Docker Hub, under `library/` when it has one part. Never a directory:
    /// `base: ubuntu` must not read a directory that happens to be called so.
    pub fn of_base(base: &str) -> Result<Transport> {
        let prefixed = ["oci:", "docker-archive:", "docker-daemon:", "docker://"]
            .iter()
            .any(|t| base.starts_with(t));
        if prefixed {
            return base.parse();
        }
        let transport: Transport = format!("docker://{base}").parse()?;
        if let Transport::Registry(remote) = &transport {
            remote.parsed()?;
        }
        Ok(transport)
    }

    /// The same transport, reaching registries as `access` says.
    pub fn with_access(self, access: &Access) -> Self {
        match self {
            Transport::Registry(r) => Transport::Registry(Remote {
                reference: r.reference,
                access: access.clone(),
            }),
            other => other,
        }
    }

    /// Refuses a transport that names no image, saying what it needs.
    pub fn supported(self) -> Result<Self> {
        match &self {
            Transport::DockerDaemon(r) if r.is_empty() => Err(Error::Usage(
                "docker-daemon: needs an image name, as in docker-daemon:train:v1".into(),
            )),
            _ => Ok(self),
        }
    }

    /// The platform read from an index when none is named: the one the registry access
    /// names (`--platform`), else this machine's.
    pub fn default_platform(&self) -> Platform {
        match self {
            Transport::Registry(r) => r.access.platform.clone(),
            _ => Platform::host(),
        }
    }

    /// Reads the image (for an index, [`Transport::default_platform`]'s).
    pub fn open(&self) -> Result<Image> {
        self.open_for(&self.default_platform())
    }

    /// Reads the image for the platform `--platform` names, refusing an image that is not
    /// for it (naming the platforms it has); without one, as [`Transport::open`] does.
    pub fn open_platform(&self, platform: Option<&Platform>) -> Result<Image> {
        let Some(platform) = platform else {
            return self.open();
        };
        let image = self.open_for(platform)?;
        self.platform_of(&image, Some(platform))?;
        Ok(image)
    }

    /// Reads the image as its source serves it now, for `verify` and `certify` to judge, as
    /// [`Transport::open_platform`] does. A registry image's blobs are all downloaded afresh
    /// into a staging layout, never taken from the blob cache (whose copies were verified
    /// once and would stand in for the registry's bytes), and a blob served with other content
    /// is kept there under its digest, for verify to re-hash and fail as it fails a layout's.
    pub fn open_as_served(&self, platform: Option<&Platform>) -> Result<Image> {
        let Transport::Registry(remote) = self else {
            return self.open_platform(platform);
        };
        let mut remote = remote.clone();
        remote.access.platform = platform.cloned().unwrap_or_else(|| self.default_platform());
        let staging = staging_dir()?;
        let layout = Layout::create(staging.path())?.named(self.to_string());
        let image = registry::open_as_served(&remote, layout, staging)?;
        self.platform_of(&image, platform)?;
        Ok(image)
    }

    /// Reads the image; for an index, the entry for `platform`.
    pub fn open_for(&self, platform: &Platform) -> Result<Image> {
        let platform = platform.clone();
        let name = self.to_string();
        match self.clone().supported()? {
            Transport::Oci { dir, tag } => {
                let layout = Layout::open(&dir)?;
                let found = layout.find(tag.as_deref())?;
                Image::in_layout(layout, &found, &platform, None)
            }
            Transport::DockerArchive { path, reference } => {
                let staging = staging_dir()?;
                let layout = Layout::create(staging.path())?.named(name);
                let (desc, made) = archive::read(&path, reference.as_deref(), &layout)?;
                Ok(Image::in_layout(layout, &desc, &platform, Some(staging))?.made_here(made))
            }
            Transport::DockerDaemon(image) => {
                let staging = staging_dir()?;
                let tar = staging.path().join("export.tar");
                crate::engine::Engine::connect()?.export(&image, &tar)?;
                let layout = Layout::create(&staging.path().join("layout"))?.named(name);
                let (desc, made) = archive::read(&tar, None, &layout)?;
                Ok(Image::in_layout(layout, &desc, &platform, Some(staging))?.made_here(made))
            }
            Transport::Registry(mut remote) => {
                remote.access.platform = platform;
                let (layout, staging) = pull_store(&remote, &name)?;
                registry::open(&remote, layout, staging)
            }
        }
    }

    /// The index here with every image it lists, when this is an OCI layout whose image is
    /// an index; None for a plain image or another transport.
    pub fn open_index(&self) -> Result<Option<IndexImage>> {
        let Transport::Oci { dir, tag } = self.clone().supported()? else {
            return Ok(None);
        };
        let layout = Layout::open(&dir)?;
        let found = layout.find(tag.as_deref())?;
        if !is_index(&found) {
            return Ok(None);
        }
        IndexImage::in_layout(layout, &found, None).map(Some)
    }

    /// The platforms of the index here, in its order; empty for a plain image (and for a
    /// docker archive or engine, which hold one).
    pub fn index_platforms(&self) -> Result<Vec<String>> {
        match self.clone().supported()? {
            Transport::Registry(remote) => {
                Ok(registry::index_platforms(&remote)?.unwrap_or_default())
            }
            _ => Ok(self
                .open_index()?
                .map(|i| i.platforms())
                .unwrap_or_default()),
        }
    }

    /// Writes a multi-platform image here: an OCI layout gets every image's blobs and the
    /// index, tagged; a registry every manifest, then the index under the tag. A docker
    /// archive and the Docker Engine hold one platform's image, so they are refused.
    pub fn write_index(&self, index: &IndexImage) -> Result<()> {
        match self.clone().supported()? {
            Transport::Oci { dir, tag } => {
                let tag = tag.unwrap_or_else(|| "latest".into());
                if index.store().root() == dir {
                    return index.store().set_tag(index.descriptor(), &tag);
                }
                let writing = Writing::start(&dir)?;
                index.copy_to(&writing.layout)?;
                writing.layout.set_tag(index.descriptor(), &tag)?;
                writing.done();
                Ok(())
            }
            Transport::DockerArchive { .. } | Transport::DockerDaemon(_) => {
                Err(Error::Usage(format!(
                    "{self}: the image is an index of {}, and a docker archive or the Docker \
                     Engine holds one platform's image only; pick one with --platform",
                    index.platforms().join(", ")
                )))
            }
            Transport::Registry(remote) => registry::push_index(index, &remote).map(|_| ()),
        }
    }

    /// Copies the image here to `dest`: for an index (in an OCI layout or a registry), every
    /// platform's image and the index's exact bytes, unless `platform` picks one. A docker
    /// archive or engine destination holds one platform, so an index bound there needs one.
    /// Every blob of the source is checked against its manifest and config (digests, tar
    /// streams, diff ids) before it is written where it goes, and a copy that fails leaves
    /// the destination as it was (see [`Writing`]). Each blob is read once: a registry image
    /// is checked as each blob streams into its temporary file (downloaded straight into an
    /// OCI layout bound there, and tagged once all hold), and an image bound for a registry
    /// as each blob streams up, the last bytes held back until it holds. Blobs the
    /// destination registry has already are not sent, nor read: it holds them under their
    /// digests, which the manifest binds.
    pub fn copy_platforms(&self, dest: &Transport, platform: Option<&Platform>) -> Result<Copied> {
        let dest = dest.clone().supported()?;
        let src = self.clone().supported()?;
        if let (Transport::Registry(remote), Transport::Oci { dir, tag }) = (&src, &dest) {
            let tag = tag.as_deref().unwrap_or("latest");
            let writing = Writing::start(dir)?;
            let layout = writing.layout.clone().named(self.to_string());
            let copied = match platform {
                None => match registry::open_index(remote, layout.clone(), true)? {
                    Some(index) => {
                        layout.set_tag(index.descriptor(), tag)?;
                        Copied::of_index(&index)
                    }
                    None => {
                        let image = registry::open_checked(remote, layout.clone(), None)?;
                        layout.set_tag(image.descriptor(), tag)?;
                        Copied::of(&image)
                    }
                },
                Some(p) => {
                    let mut remote = remote.clone();
                    remote.access.platform = p.clone();
                    let image = registry::open_checked(&remote, layout.clone(), None)?;
                    self.platform_of(&image, platform)?;
                    layout.set_tag(image.descriptor(), tag)?;
                    Copied::of(&image)
                }
            };
            writing.done();
            return Ok(copied);
        }
        // A push checks each layer it uploads as it streams; a pull, each one it downloads.
        let checked_as_sent = |image: &Image| match dest {
            Transport::Registry(_) => image.layers().iter().map(|l| l.digest()).collect(),
            _ => Ok(std::collections::HashSet::new()),
        };
        let index = match (platform, &src) {
            (Some(_), _) => None,
            (None, Transport::Registry(remote)) => self.registry_index(remote)?,
            (None, _) => match self.open_index()? {
                Some(index) => {
                    for image in index.images() {
                        image.check_except(&checked_as_sent(image)?)?;
                    }
                    Some(index)
                }
                None => None,
            },
        };
        if let Some(index) = index {
            dest.write_index(&index)?;
            return Ok(Copied::of_index(&index));
        }
        let image = match &src {
            Transport::Registry(remote) => self.open_checked(remote, platform)?,
            _ => {
                let image = self.open_platform(platform)?;
                image.check_except(&checked_as_sent(&image)?)?;
                image
            }
        };
        dest.write(&image, None)?;
        Ok(Copied::of(&image))
    }

    /// [`Transport::copy_platforms`] with every layer rewritten as `compression` (eStargz or
    /// zstd:chunked) on the way (`copy --compression`), for nodes that pull lazily: the source
    /// is checked as a copy checks it, each layer framed anew (see [`super::convert`]) in
    /// gpubake's cache layout, where the result stays keyed by the source layer's digest, and
    /// the new image (a new config and manifest, so a new digest; an index of the converted
    /// images for an index) is written to `dest`.
    pub fn copy_as_lazy(
        &self,
        dest: &Transport,
        platform: Option<&Platform>,
        compression: super::layer::Compression,
    ) -> Result<Copied> {
        let dest = dest.clone().supported()?;
        let src = self.clone().supported()?;
        let store = Layout::open_cache(&crate::fsutil::cache_root()?.join("layout"))?;
        let _lock = store.lock()?;
        let index = match (platform, &src) {
            (Some(_), _) => None,
            (None, Transport::Registry(remote)) => self.registry_index(remote)?,
            (None, _) => self.open_index()?,
        };
        if let Some(index) = index {
            let mut images = Vec::new();
            for image in index.images() {
                image.check()?;
                images.push(super::convert::lazy_image(image, &store, compression)?);
            }
            let converted = IndexImage::write(&store, images)?;
            dest.write_index(&converted)?;
            return Ok(Copied::of_index(&converted));
        }
        let image = match &src {
            Transport::Registry(remote) => self.open_checked(remote, platform)?,
            _ => {
                let image = self.open_platform(platform)?;
                image.check()?;
                image
            }
        };
        let converted = super::convert::lazy_image(&image, &store, compression)?;
        dest.write(&converted, None)?;
        Ok(Copied::of(&converted))
    }

    /// The index the registry `remote` (this transport's) serves under its reference, checked
    /// as its images stream into the blob cache; None for a plain image.
    fn registry_index(&self, remote: &Remote) -> Result<Option<IndexImage>> {
        let (layout, staging) = pull_store(remote, &self.to_string())?;
        Ok(
            registry::open_index(remote, layout, true)?.map(|i| match staging {
                Some(s) => i.with_staging(s),
                None => i,
            }),
        )
    }

    /// The registry image `remote` (this transport's) for `platform` as [`Transport::open_platform`]
    /// reads it, checked as `copy` checks its source while its blobs stream into the blob
    /// cache (see [`registry::open_checked`]).
    fn open_checked(&self, remote: &Remote, platform: Option<&Platform>) -> Result<Image> {
        let mut remote = remote.clone();
        remote.access.platform = platform.cloned().unwrap_or_else(|| self.default_platform());
        let (layout, staging) = pull_store(&remote, &self.to_string())?;
        let image = registry::open_checked(&remote, layout, staging)?;
        self.platform_of(&image, platform)?;
        Ok(image)
    }

    /// Refuses `image`, read for `platform`, when it is not for that platform.
    fn platform_of(&self, image: &Image, platform: Option<&Platform>) -> Result<()> {
        match (platform, image.platform()?) {
            (Some(want), Some(has)) if !want.accepts(&has) => Err(Error::Usage(format!(
                "{self}: the image is for {has} only, not {want}; leave --platform out or \
                 name {has}"
            ))),
            _ => Ok(()),
        }
    }

    /// Writes `image` here: an OCI layout gets its blobs (unless they are already there) and
    /// the tag (`latest` when none is named); an archive is written whole, atomically; an
    /// engine loads one. `name` is the `NAME:TAG` an archive records when its transport
    /// names none; without either, the archive records no name, as skopeo writes one, and
    /// `docker load` loads the image untagged.
    pub fn write(&self, image: &Image, name: Option<&str>) -> Result<()> {
        match self.clone().supported()? {
            Transport::Oci { dir, tag } => {
                let tag = tag.unwrap_or_else(|| "latest".into());
                if image.store().root() == dir {
                    // The image was made in this layout (by build, holding its lock).
                    return image.store().set_tag(image.descriptor(), &tag);
                }
                let writing = Writing::start(&dir)?;
                image.copy_to(&writing.layout)?;
                writing.layout.set_tag(image.descriptor(), &tag)?;
                writing.done();
                Ok(())
            }
            Transport::DockerArchive { path, reference } => {
                archive::write(image, &path, reference.as_deref().or(name))
            }
            Transport::DockerDaemon(reference) => {
                let reference = if reference.contains(':') {
                    reference
                } else {
                    format!("{reference}:latest")
                };
                let engine = crate::engine::Engine::connect()?;
                let left_out = layers_in_engine(&engine, image)?;
                engine.load_with(|out| {
                    let stopped = |e: std::io::Error| {
                        if e.kind() == std::io::ErrorKind::BrokenPipe {
                            Error::Environment("the engine stopped reading the image".into())
                        } else {
                            Error::writing("the image's stream to the engine", e)
                        }
                    };
                    archive::write_to(image, out, Some(&reference), &left_out, &stopped).map(drop)
                })
            }
            Transport::Registry(remote) => registry::push(image, &remote).map(|_| ()),
        }
    }
}

/// The layers of `image` that need not be sent to `engine`: those whose chain ID (the
/// layer with every layer below it) the engine holds, where its load looks layers up that
/// way. A blob that is two layers of the image is left out only when both are there.
fn layers_in_engine(
    engine: &crate::engine::Engine,
    image: &Image,
) -> Result<std::collections::HashSet<Digest>> {
    let mut left_out = std::collections::HashSet::new();
    if !engine.loads_by_chain_id() {
        return Ok(left_out);
    }
    let config = image.typed_config()?;
    let chains = crate::engine::chain_ids(config.diff_ids());
    let present = engine.layer_chains()?;
    let layers = image.manifest().layers();
    let digests = layers
        .iter()
        .map(super::layout::digest_of)
        .collect::<Result<Vec<_>>>()?;
    for (digest, _) in digests.iter().zip(&chains) {
        let everywhere = digests
            .iter()
            .zip(&chains)
            .filter(|(d, _)| *d == digest)
            .all(|(_, chain)| present.contains(chain));
        if everywhere {
            left_out.insert(digest.clone());
        }
    }
    Ok(left_out)
}

/// Where a registry image's blobs are pulled: the blob cache, where build keeps its layers,
/// so that a base read twice is downloaded once; else a staging layout, kept with the image.
fn pull_store(
    remote: &Remote,
    name: &str,
) -> Result<(Layout, Option<crate::interrupt::ScratchDir>)> {
    match &remote.access.blob_cache {
        Some(cache) => Ok((Layout::open_cache(cache)?.named(name), None)),
        None => {
            let staging = staging_dir()?;
            let layout = Layout::create(staging.path())?.named(name);
            Ok((layout, Some(staging)))
        }
    }
}

/// An OCI layout being written, under its lock. Until [`Writing::done`], dropping it undoes
/// what the writing added: a layout it created is removed whole, and the blobs it added to
/// one that was there are deleted, so a failed or interrupted copy leaves the destination
/// as it was (`index.json` is only ever replaced whole, last).
struct Writing {
    layout: Layout,
    created: Option<crate::interrupt::Staged>,
    /// The blobs an existing layout held before; None once done (or for a new layout).
    before: Option<std::collections::HashSet<std::ffi::OsString>>,
    _lock: super::layout::LayoutLock,
}

impl Writing {
    fn start(dir: &Path) -> Result<Writing> {
        let created = (!dir.exists()).then(|| crate::interrupt::Staged::new(dir));
        let layout = Layout::create(dir)?;
        let lock = layout.lock()?;
        let before = created.is_none().then(|| blob_files(&layout));
        Ok(Writing {
            layout,
            created,
            before,
            _lock: lock,
        })
    }

    /// The image is written and tagged: keep everything.
    fn done(mut self) {
        if let Some(created) = self.created.take() {
            created.keep();
        }
        self.before = None;
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if let Some(before) = self.before.take() {
            for name in blob_files(&self.layout).difference(&before) {
                let _ = std::fs::remove_file(self.layout.root().join("blobs/sha256").join(name));
            }
        }
    }
}

/// The names of the files in a layout's blob directory.
fn blob_files(layout: &Layout) -> std::collections::HashSet<std::ffi::OsString> {
    std::fs::read_dir(layout.root().join("blobs/sha256"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect()
}

/// What a copy wrote.
#[derive(Debug)]
pub struct Copied {
    /// The manifest's digest, or the index's.
    pub digest: Digest,
    /// The bytes of every blob.
    pub bytes: u64,
    /// How many blobs.
    pub blobs: usize,
    /// The platforms of an index, in its order; empty for one image.
    pub platforms: Vec<String>,
    /// The source held no manifest (a docker archive without one, an engine's export), so
    /// gpubake made it from Docker's `manifest.json`: other tools may make another.
    pub made_here: bool,
}

impl Copied {
    fn of(image: &Image) -> Copied {
        Copied {
            digest: image.digest().clone(),
            bytes: image.blobs().map(|d| d.size()).sum(),
            blobs: image.blobs().count(),
            platforms: Vec::new(),
            made_here: image.is_made_here(),
        }
    }

    fn of_index(index: &IndexImage) -> Copied {
        let blobs: Vec<&oci_spec::image::Descriptor> =
            index.images().iter().flat_map(|i| i.blobs()).collect();
        Copied {
            digest: index.digest().clone(),
            bytes: blobs.iter().map(|d| d.size()).sum(),
            blobs: blobs.len(),
            platforms: index.platforms(),
            made_here: false,
        }
    }
}

/// A directory for what a source stages, removed when the image is dropped or on interrupt.
fn staging_dir() -> Result<crate::interrupt::ScratchDir> {
    crate::interrupt::scratch_dir(None, ".gpubake-open-")
        .map_err(|e| Error::writing(std::env::temp_dir(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Transport {
        s.parse().unwrap()
    }

    #[test]
    fn a_recipes_base_is_named_as_docker_names_images() {
        let registry = |base: &str| match Transport::of_base(base).unwrap() {
            Transport::Registry(r) => {
                let parsed = r.parsed().unwrap();
                (
                    parsed.resolve_registry().to_string(),
                    parsed.repository().to_string(),
                )
            }
            other => panic!("{base}: {other}"),
        };
        let hub = |repo: &str| ("index.docker.io".to_string(), repo.to_string());
        assert_eq!(registry("ubuntu:24.04"), hub("library/ubuntu"));
        assert_eq!(
            registry("nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"),
            hub("nvidia/cuda")
        );
        assert_eq!(
            registry("registry.example:5000/team/base:1"),
            ("registry.example:5000".into(), "team/base".into())
        );
        assert_eq!(
            registry("localhost/base"),
            ("localhost".into(), "base".into())
        );
        // A transport written out is read as one; a plain word is never a directory.
        assert!(matches!(
            Transport::of_base("oci:./base:bookworm").unwrap(),
            Transport::Oci { .. }
        ));
        assert!(Transport::of_base("Not A Reference").is_err());
    }

    #[test]
    fn skopeo_syntax_parses() {
        assert_eq!(
            t("oci:./img:v1"),
            Transport::Oci {
                dir: "./img".into(),
                tag: Some("v1".into())
            }
        );
        assert_eq!(
            t("oci:/a/b"),
            Transport::Oci {
                dir: "/a/b".into(),
                tag: None
            }
        );
        assert_eq!(
            t("docker-archive:x.tar:name:tag"),
            Transport::DockerArchive {
                path: "x.tar".into(),
                reference: Some("name:tag".into())
            }
        );
        assert_eq!(
            t("docker://nvcr.io/nvidia/cuda:12.8").to_string(),
            "docker://nvcr.io/nvidia/cuda:12.8"
        );
        assert!(matches!(
            t("docker://nvcr.io/nvidia/cuda:12.8"),
            Transport::Registry(Remote { reference, .. }) if reference == "nvcr.io/nvidia/cuda:12.8"
        ));
        assert!("docker://".parse::<Transport>().is_err());
        assert!("ubuntu:24.04".parse::<Transport>().is_err());
        assert!("oci:".parse::<Transport>().is_err());
        assert_eq!(t("oci:./img:v1").to_string(), "oci:./img:v1");
    }

    #[test]
    fn a_plain_path_is_an_oci_layout_and_an_unknown_scheme_is_refused() {
        assert_eq!(
            t("./out"),
            Transport::Oci {
                dir: "./out".into(),
                tag: None
            }
        );
        assert_eq!(
            t("/abs/out:v1"),
            Transport::Oci {
                dir: "/abs/out".into(),
                tag: Some("v1".into())
            }
        );
        let err = "containers-storage:img"
            .parse::<Transport>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`containers-storage:` is not a transport"),
            "{err}"
        );
        assert!(err.contains("docker://REGISTRY/NAME:TAG"), "{err}");
    }

    #[test]
    fn tags_follow_the_oci_ref_name_grammar() {
        for good in ["v1", "v1.2-rc+1", "a--b", "A_b", "a@b", "team/x"] {
            assert!(is_ref_name(good), "{good}");
        }
        for bad in [
            "Bad Tag!", "-x", "a..b", "a---b", "x.", "_x", "a__b", "a//b",
        ] {
            assert!(!is_ref_name(bad), "{bad}");
        }
    }

    #[test]
    fn docker_daemon_needs_a_name() {
        assert!(t("docker-daemon:").supported().is_err());
        assert!(t("docker-daemon:train:v1").supported().is_ok());
    }
}
