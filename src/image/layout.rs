//! An OCI image layout on disk (`oci-layout`, `index.json`, `blobs/sha256/…`): blobs are
//! written to a temporary file, hashed on the way, and renamed into place under their digest;
//! `index.json` is replaced last, so a build killed at any point leaves the previous image
//! readable. Every blob read is checked against its digest and size.

use super::digest::{Digest, HashingWriter, Tally, VerifyingReader};
use crate::error::{Error, Result};
use crate::fsutil::Placement;
use oci_spec::image::{Descriptor, ImageIndex, MediaType};
use serde::Serialize;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The annotation that names a tag in `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Manifests and configs larger than this are refused: 4 MiB is where registries,
/// containerd and skopeo (containers/image's limits) stop, so an image gpubake accepts is one
/// they accept too.
pub const MAX_JSON_BYTES: u64 = 4 << 20;

/// Serialises `value` with sorted keys, so equal content gives equal bytes (oci-spec keeps
/// labels and annotations in hash maps).
pub fn canonical_json<T: Serialize>(value: &T) -> Vec<u8> {
    let value = serde_json::to_value(value).expect("image metadata serializes");
    serde_json::to_vec(&value).expect("JSON values serialize")
}

/// An OCI layout directory.
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
    /// What messages call it when it is not the user's own layout (a staging directory that
    /// holds an archive's members or a registry's downloads): the image it was read from.
    name: Option<String>,
    /// The layer cache it takes layers from and gives its new ones to (gpubake's cache
    /// layout), for a layout a build writes.
    shared: Option<Box<Layout>>,
    /// Whether blobs go between it and `shared` by hard link (`build --link-blobs`) rather
    /// than by reflink or copy.
    link_shared: bool,
    /// For gpubake's cache: a shared lock on its users file, held while any copy of this
    /// value lives, so that `gpubake gc --cache` (which takes it exclusively) never removes
    /// a blob a build or a pull has written and not yet recorded.
    _users: Option<std::sync::Arc<File>>,
}

/// The file every user of gpubake's cache holds a shared lock on.
const CACHE_USERS: &str = ".gpubake-users";

/// A blob [`Layout::adopt_blob`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adopted {
    /// The layout held it already.
    Present,
    /// Taken from the cache now, placed so.
    Placed(Placement),
}

/// Holds the layout's lock file until dropped.
pub struct LayoutLock {
    _file: File,
}

impl Layout {
    /// Opens an existing layout, checking that it is one.
    pub fn open(root: &Path) -> Result<Self> {
        let marker = root.join("oci-layout");
        let text = std::fs::read_to_string(&marker)
            .map_err(|e| Error::image(marker.display(), format!("not an OCI layout ({e})")))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::image(marker.display(), format!("not valid JSON: {e}")))?;
        if value["imageLayoutVersion"].as_str().is_none() {
            return Err(Error::image(marker.display(), "has no imageLayoutVersion"));
        }
        Ok(Layout {
            root: root.to_path_buf(),
            name: None,
            shared: None,
            link_shared: false,
            _users: None,
        })
    }

    /// The same layout, called `name` in messages: the image a staging layout holds, so an
    /// error names what the user gave rather than a temporary directory.
    pub fn named(self, name: impl Into<String>) -> Self {
        Layout {
            name: Some(name.into()),
            ..self
        }
    }

    /// Opens a layout, creating the directory structure if it does not exist yet.
    pub fn create(root: &Path) -> Result<Self> {
        let blobs = root.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(|e| Error::writing(&blobs, e))?;
        let marker = root.join("oci-layout");
        if !marker.exists() {
            crate::fsutil::write_atomic(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        }
        Self::open(root)
    }

    /// gpubake's cache layout at `root` (created if need be), in use: a shared lock on its
    /// users file is held while any copy of the value lives. Waits while `gpubake gc --cache`
    /// runs.
    pub fn open_cache(root: &Path) -> Result<Self> {
        let layout = Self::create(root)?;
        let waiting = || format!("waiting for `gpubake gc` to finish with {}", root.display());
        let file = lock_file(&root.join(CACHE_USERS), Share::Shared, waiting)?;
        Ok(Layout {
            _users: Some(std::sync::Arc::new(file)),
            ..layout
        })
    }

    /// Takes the cache's users lock exclusively, waiting for every build and pull that uses
    /// it to finish: what `gpubake gc --cache` holds while it looks and removes.
    pub fn lock_cache_users(&self) -> Result<LayoutLock> {
        let waiting = || {
            format!(
                "waiting for the builds using {} to finish",
                self.root.display()
            )
        };
        let file = lock_file(&self.root.join(CACHE_USERS), Share::Exclusive, waiting)?;
        Ok(LayoutLock { _file: file })
    }

    /// The layout's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The same layout, sharing gpubake's records (`.gpubake/…`) and the blobs they name
    /// with the layout at `cache`: a record found there brings its blob along, and what is
    /// recorded here is recorded there too. A blob goes between the two by reflink, else by
    /// copy, so that the layout shares no writable file with the cache or with any other
    /// layout; with `link`, by hard link first, which writes nothing but leaves them one file.
    pub fn sharing(self, cache: &Layout, link: bool) -> Self {
        let shared = (cache.root != self.root).then(|| Box::new(cache.clone()));
        // Builds share the cache without its lock: only what no live writer owns goes.
        cache.sweep_leftovers();
        Layout {
            shared,
            link_shared: link,
            ..self
        }
    }

    /// A record of gpubake's own under `.gpubake/` (`layers/KEY.json`): this layout's, else
    /// its cache's, which is then kept here too.
    pub fn read_record(&self, name: &str) -> Option<Vec<u8>> {
        if let Ok(bytes) = std::fs::read(self.root.join(".gpubake").join(name)) {
            return Some(bytes);
        }
        let cache = self.shared.as_ref()?;
        let bytes = std::fs::read(cache.root.join(".gpubake").join(name)).ok()?;
        self.write_record(name, &bytes, true).ok()?;
        Some(bytes)
    }

    /// Writes a record under `.gpubake/`, here and, unless `here_only`, in the cache (where
    /// a failure only loses the cache's copy).
    pub fn write_record(&self, name: &str, bytes: &[u8], here_only: bool) -> Result<()> {
        let write = |root: &Path| {
            let path = root.join(".gpubake").join(name);
            let dir = path.parent().expect("records live in a directory");
            std::fs::create_dir_all(dir).map_err(|e| Error::writing(dir, e))?;
            crate::fsutil::write_atomic(&path, bytes)
        };
        write(&self.root)?;
        if let Some(cache) = self.shared.as_ref().filter(|_| !here_only) {
            let _ = write(&cache.root);
        }
        Ok(())
    }

    /// Whether the blob is here, taking it from the cache first when only the cache has it
    /// (and then how it was placed). What is placed is read through against its digest: a
    /// cache file changed in place is removed rather than handed on, and the layer is
    /// written again.
    pub fn adopt_blob(&self, digest: &Digest, size: u64) -> Option<Adopted> {
        if self.has_blob(digest, size) {
            return Some(Adopted::Present);
        }
        let cache = self.shared.as_ref()?;
        if !cache.has_blob(digest, size) {
            return None;
        }
        let source = cache.blob_path(digest);
        match self.place_blob(&source, self, digest, size) {
            Ok(how) => Some(Adopted::Placed(how)),
            Err(e) => {
                if e.kind() == std::io::ErrorKind::InvalidData {
                    let _ = std::fs::remove_file(&source);
                }
                None
            }
        }
    }

    /// Gives a blob of this layout to the cache, unless the cache has it (a failure only
    /// loses the cache's copy); says how it went there. A blob that no longer matches its
    /// digest (changed in place here) is not given.
    pub fn share_blob(&self, digest: &Digest, size: u64) -> Option<Placement> {
        let cache = self.shared.as_ref()?;
        if cache.has_blob(digest, size) {
            return None;
        }
        std::fs::create_dir_all(cache.root.join("blobs/sha256")).ok()?;
        self.place_blob(&self.blob_path(digest), cache, digest, size)
            .ok()
    }

    /// Places the blob file `source` into layout `to`, by this layout's rule (hard link with
    /// `--link-blobs`, else reflink or copy), checked against its digest; its temporary
    /// file lies in `to`'s root, where umoci and gc expect no stray names among the blobs.
    fn place_blob(
        &self,
        source: &Path,
        to: &Layout,
        digest: &Digest,
        size: u64,
    ) -> std::io::Result<Placement> {
        let check = |path: &Path| {
            let file = File::open(path)?;
            let mut reader = VerifyingReader::new(
                BufReader::with_capacity(1 << 20, file),
                digest.clone(),
                Some(size),
                format!("blob {digest}"),
            );
            std::io::copy(&mut reader, &mut std::io::sink()).map(drop)
        };
        crate::fsutil::place_file(
            source,
            &to.blob_path(digest),
            &to.root,
            self.link_shared,
            &check,
        )
    }

    /// Takes the layout's exclusive lock, waiting for another build to finish first, then
    /// removes the temporary files killed writers left in it.
    pub fn lock(&self) -> Result<LayoutLock> {
        let lock = self.lock_as_found()?;
        self.sweep_leftovers();
        Ok(lock)
    }

    /// Takes the layout's exclusive lock and leaves the layout as it is: for `gpubake gc`,
    /// which reports what it removes.
    pub fn lock_as_found(&self) -> Result<LayoutLock> {
        let waiting = || {
            format!(
                "waiting for another build to release {}",
                self.root.display()
            )
        };
        let file = lock_file(&self.root.join(".gpubake-lock"), Share::Exclusive, waiting)?;
        Ok(LayoutLock { _file: file })
    }

    /// Removes the temporary files killed writers left in the layout: blobs being written,
    /// replacements of `index.json`, records (see [`crate::interrupt::TEMP_FILE_PREFIX`]), and
    /// those of earlier releases (`blobs/sha256/.tmp-*`, `.gpubake-XXXXXX`) once a minute old.
    fn sweep_leftovers(&self) {
        for (dir, legacy) in self.temp_dirs() {
            crate::interrupt::sweep_temp_files(&dir, &legacy);
        }
    }

    /// The directories gpubake writes temporary files in, each with the names earlier
    /// releases gave theirs there.
    pub(crate) fn temp_dirs(&self) -> Vec<(PathBuf, crate::interrupt::LegacyTempName)> {
        fn blob_temp(name: &str) -> bool {
            name.starts_with(".tmp-")
        }
        // tempfile's names: the prefix and six random characters (never `.gpubake-lock`).
        fn index_temp(name: &str) -> bool {
            name.strip_prefix(".gpubake-").is_some_and(|rest| {
                rest.len() == 6 && rest != "lock" && rest.bytes().all(|b| b.is_ascii_alphanumeric())
            })
        }
        fn none(_: &str) -> bool {
            false
        }
        let mut dirs: Vec<(PathBuf, crate::interrupt::LegacyTempName)> = vec![
            (self.root.join("blobs/sha256"), blob_temp),
            (self.root.clone(), index_temp),
        ];
        if let Ok(kinds) = std::fs::read_dir(self.root.join(".gpubake")) {
            for kind in kinds
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            {
                dirs.push((kind.path(), index_temp));
            }
        }
        dirs.push((self.root.join(".gpubake"), none));
        dirs
    }

    /// Where a blob lives.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    /// True when the blob is present with the expected size. Blobs only ever land here under
    /// their verified digest, so presence is trusted for skipping writes; reads still verify.
    pub fn has_blob(&self, digest: &Digest, size: u64) -> bool {
        std::fs::metadata(self.blob_path(digest)).is_ok_and(|m| m.len() == size)
    }

    /// A reader over a blob that fails unless the content matches the descriptor.
    pub fn open_blob(
        &self,
        digest: &Digest,
        size: Option<u64>,
    ) -> Result<VerifyingReader<BufReader<File>>> {
        let path = self.blob_path(digest);
        let file = File::open(&path).map_err(|e| {
            Error::image(
                self.describe(),
                format!("blob {digest} is missing or unreadable ({e})"),
            )
        })?;
        Ok(VerifyingReader::new(
            BufReader::with_capacity(1 << 20, file),
            digest.clone(),
            size,
            // Callers put the layout's name before what the reader says.
            format!("blob {digest}"),
        ))
    }

    /// Reads a small blob (JSON) fully, verified.
    pub fn read_blob(&self, digest: &Digest, size: Option<u64>) -> Result<Vec<u8>> {
        if size.is_some_and(|s| s > MAX_JSON_BYTES) {
            return Err(Error::image(
                self.describe(),
                format!(
                    "blob {digest} is {} bytes, more than the {} a manifest or config may have",
                    size.unwrap_or(0),
                    MAX_JSON_BYTES
                ),
            ));
        }
        let mut out = Vec::new();
        self.open_blob(digest, size)?
            .take(MAX_JSON_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| Error::image(self.describe(), e.to_string()))?;
        Ok(out)
    }

    /// Stores `bytes` as a blob; returns its digest and size.
    pub fn write_blob(&self, bytes: &[u8]) -> Result<(Digest, u64)> {
        let digest = Digest::of(bytes);
        if !self.has_blob(&digest, bytes.len() as u64) {
            let mut w = self.blob_writer()?;
            w.write_all(bytes)
                .map_err(|e| Error::writing(self.root.join("blobs"), e))?;
            w.commit()?;
        }
        Ok((digest, bytes.len() as u64))
    }

    /// A writer for a new blob whose digest is known only at the end.
    pub fn blob_writer(&self) -> Result<BlobWriter> {
        // Beside `index.json`, not among the blobs: a file there that is not named by a
        // digest stops `umoci gc` ("invalid digest"), and a rename within the layout is as
        // atomic from there.
        let dir = self.root.clone();
        let (tmp, scratch) =
            crate::interrupt::temp_file(&dir).map_err(|e| Error::writing(&dir, e))?;
        let file = tmp
            .as_file()
            .try_clone()
            .map_err(|e| Error::writing(tmp.path(), e))?;
        let (writer, tally) = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
        Ok(BlobWriter {
            _scratch: scratch,
            tmp,
            writer: Some(writer),
            tally,
            layout: self.clone(),
        })
    }

    /// Serialises `value` canonically and stores it as a blob with a descriptor.
    pub fn write_json<T: Serialize>(&self, value: &T, media_type: MediaType) -> Result<Descriptor> {
        let bytes = canonical_json(value);
        let (digest, size) = self.write_blob(&bytes)?;
        Ok(descriptor(media_type, &digest, size))
    }

    /// Reads and parses `index.json`.
    pub fn index(&self) -> Result<ImageIndex> {
        let path = self.root.join("index.json");
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::image(path.display(), format!("unreadable ({e})")))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Error::image(path.display(), format!("not a valid OCI image index: {e}")))
    }

    /// The index, or an empty one for a new layout.
    pub fn index_or_empty(&self) -> Result<ImageIndex> {
        if self.root.join("index.json").exists() {
            self.index()
        } else {
            Ok(oci_spec::image::ImageIndexBuilder::default()
                .schema_version(2u32)
                .manifests(Vec::<Descriptor>::new())
                .build()
                .expect("an empty index is valid"))
        }
    }

    /// Replaces `index.json` atomically.
    pub fn write_index(&self, index: &ImageIndex) -> Result<()> {
        crate::fsutil::write_atomic(&self.root.join("index.json"), &canonical_json(index))
    }

    /// The manifest descriptor tagged `tag`, or the only one when `tag` is None.
    pub fn find(&self, tag: Option<&str>) -> Result<Descriptor> {
        let index = self.index()?;
        let tagged = |d: &&Descriptor| {
            let name = d.annotations().as_ref().and_then(|a| a.get(REF_NAME));
            tag.is_none_or(|t| name.is_some_and(|n| n == t))
        };
        let found: Vec<&Descriptor> = index.manifests().iter().filter(tagged).collect();
        match (found.as_slice(), tag) {
            ([one], _) => Ok((*one).clone()),
            ([], Some(t)) => Err(Error::image(
                self.describe(),
                format!("no image tagged `{t}`"),
            )),
            ([], None) => Err(Error::image(self.describe(), "holds no image")),
            (_, _) => Err(Error::image(
                self.describe(),
                format!("holds {} images; name one with oci:DIR:TAG", found.len()),
            )),
        }
    }

    /// Points `tag` at `desc` in `index.json`, replacing what it pointed at before.
    pub fn set_tag(&self, desc: &Descriptor, tag: &str) -> Result<()> {
        let mut index = self.index_or_empty()?;
        let mut manifests: Vec<Descriptor> = index
            .manifests()
            .iter()
            .filter(|d| {
                d.annotations()
                    .as_ref()
                    .and_then(|a| a.get(REF_NAME))
                    .map(String::as_str)
                    != Some(tag)
            })
            .cloned()
            .collect();
        let mut tagged = desc.clone();
        tagged.set_annotations(Some(std::collections::HashMap::from([(
            REF_NAME.to_string(),
            tag.to_string(),
        )])));
        manifests.push(tagged);
        index.set_manifests(manifests);
        self.write_index(&index)
    }

    /// `oci:DIR` for messages, or the image a staging layout was filled from.
    pub fn describe(&self) -> String {
        match &self.name {
            Some(name) => name.clone(),
            None => format!("oci:{}", self.root.display()),
        }
    }
}

/// How a lock file is held.
enum Share {
    Shared,
    Exclusive,
}

/// Opens (creating) the lock file at `path` and locks it, saying on stderr what it waits for
/// when another process holds it.
fn lock_file(path: &Path, share: Share, waiting: impl FnOnce() -> String) -> Result<File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::writing(path, e))?;
    let free = match share {
        Share::Shared => file.try_lock_shared().is_ok(),
        Share::Exclusive => file.try_lock().is_ok(),
    };
    if !free {
        eprintln!("gpubake: {}", waiting());
        match share {
            Share::Shared => file.lock_shared(),
            Share::Exclusive => file.lock(),
        }
        .map_err(|e| Error::io(path, e))?;
    }
    Ok(file)
}

/// A blob being written: a temporary file in the layout's root, renamed under its digest on
/// [`BlobWriter::commit`], deleted if dropped uncommitted.
pub struct BlobWriter {
    tmp: tempfile::NamedTempFile,
    _scratch: crate::interrupt::Scratch,
    writer: Option<HashingWriter<BufWriter<File>>>,
    tally: Tally,
    layout: Layout,
}

impl BlobWriter {
    /// Takes the underlying writer, for encoders that need to own theirs. The digest is
    /// still collected; call [`BlobWriter::commit`] once the encoder has finished.
    pub fn take_writer(&mut self) -> HashingWriter<BufWriter<File>> {
        self.writer.take().expect("the writer is taken once")
    }

    /// Flushes, syncs and moves the blob into place; returns its digest and size.
    pub fn commit(mut self) -> Result<(Digest, u64)> {
        let (digest, size) = self.written()?;
        self.persist(digest, size)
    }

    /// As [`BlobWriter::commit`], but the blob is moved into place only when its content is
    /// `want`: otherwise the temporary file is deleted, and the digest the content has is
    /// returned instead of the size.
    pub fn commit_if(mut self, want: &Digest) -> Result<std::result::Result<u64, Digest>> {
        let (digest, size) = self.written()?;
        if digest != *want {
            return Ok(Err(digest));
        }
        self.persist(digest, size).map(|(_, size)| Ok(size))
    }

    /// The digest of what was written; the temporary file is deleted.
    pub fn discard(mut self) -> Result<Digest> {
        self.written().map(|(digest, _)| digest)
    }

    /// Flushes and syncs what was written; its digest and size.
    fn written(&mut self) -> Result<(Digest, u64)> {
        if let Some(w) = self.writer.take() {
            let mut inner = w.into_inner();
            inner
                .flush()
                .map_err(|e| Error::writing(self.tmp.path(), e))?;
        }
        self.tmp
            .as_file()
            .sync_all()
            .map_err(|e| Error::writing(self.tmp.path(), e))?;
        Ok(self.tally.finish())
    }

    /// Moves the written blob into place under `digest`, its content's.
    fn persist(self, digest: Digest, size: u64) -> Result<(Digest, u64)> {
        let target = self.layout.blob_path(&digest);
        if self.layout.has_blob(&digest, size) {
            return Ok((digest, size));
        }
        // Blobs are shared content: 0644 under the usual umask, as umoci and skopeo leave them.
        crate::fsutil::match_mode(self.tmp.as_file(), &target)
            .map_err(|e| Error::writing(self.tmp.path(), e))?;
        self.tmp
            .persist(&target)
            .map_err(|e| Error::writing(&target, e.error))?;
        Ok((digest, size))
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer.as_mut().expect("writer not taken").write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.as_mut().expect("writer not taken").flush()
    }
}

/// A descriptor for a blob.
pub fn descriptor(media_type: MediaType, digest: &Digest, size: u64) -> Descriptor {
    let d: oci_spec::image::Digest = digest.as_str().parse().expect("our digests are valid");
    Descriptor::new(media_type, size, d)
}

/// The sha256 digest of a descriptor, refusing other algorithms and malformed values.
pub fn digest_of(desc: &Descriptor) -> Result<Digest> {
    desc.digest()
        .to_string()
        .parse()
        .map_err(|e: String| Error::image("descriptor", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_holder_sweeps_what_killed_writers_left() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path()).unwrap();
        let blobs = dir.path().join("blobs/sha256");
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for (path, text) in [
            (blobs.join(".tmp-abc123"), "half a blob"),
            (dir.path().join(".gpubake-Xy12Zq"), "half an index"),
        ] {
            std::fs::write(&path, text).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(an_hour_ago)
                .unwrap();
        }
        // A temporary file of this moment may be another writer's: it stays.
        std::fs::write(blobs.join(".tmp-justnw"), "being written").unwrap();
        let (kept, _) = layout.write_blob(b"{}").unwrap();
        let lock = layout.lock().unwrap();
        assert!(!blobs.join(".tmp-abc123").exists());
        assert!(!dir.path().join(".gpubake-Xy12Zq").exists());
        assert!(blobs.join(".tmp-justnw").exists());
        assert!(dir.path().join(".gpubake-lock").exists());
        assert!(layout.blob_path(&kept).exists());
        drop(lock);
    }

    #[test]
    fn metadata_over_4_mib_is_refused_as_registries_refuse_it() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path()).unwrap();
        let fits = vec![b' '; 4 << 20];
        let (d, n) = layout.write_blob(&fits).unwrap();
        assert!(layout.read_blob(&d, Some(n)).is_ok());
        let over = vec![b' '; (4 << 20) + 1];
        let (d, n) = layout.write_blob(&over).unwrap();
        let err = layout.read_blob(&d, Some(n)).unwrap_err().to_string();
        assert!(err.contains("more than the 4194304"), "{err}");
    }
}
