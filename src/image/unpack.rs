//! An image's layers applied in order to a directory: the root filesystem of an OCI runtime
//! bundle. Whiteouts (`.wh.NAME`, `.wh..wh..opq`) delete what lower layers put there, as the
//! image spec says; every blob is verified against its digest and its diff id while it is
//! read, and no entry may land outside the root.

use super::model::{Image, strings};
use super::tarstream::End;
use crate::error::{Error, Result};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Unpacks every layer of `image` under `root` (created when missing). Ownership is kept when
/// running as root, as a runtime's bundle needs it.
pub fn unpack(image: &Image, root: &Path) -> Result<()> {
    unpack_where(image, root, &|_, _| true)
}

/// Unpacks every layer of `image` under `root`, going on past a layer that does not read:
/// each layer's own result (its blob digest and diff id checked while it is read), for a
/// caller that judges every layer rather than stopping at the first bad one. What lies above
/// a bad layer may be missing from the tree.
pub fn unpack_checked(image: &Image, root: &Path) -> Result<Vec<std::result::Result<(), String>>> {
    std::fs::create_dir_all(root).map_err(|e| Error::writing(root, e))?;
    Ok(apply_layers(image, root, &|_, _| true, false))
}

/// Unpacks only what lies under `paths` (relative, such as `etc/apt`) and the directories
/// above them: the few files a step reads from a base of gigabytes.
pub fn unpack_paths(image: &Image, root: &Path, paths: &[&str]) -> Result<()> {
    let wanted = |inside: &Path, _: tar::EntryType| {
        paths.iter().any(|p| {
            let p = Path::new(p);
            inside.starts_with(p) || p.starts_with(inside)
        })
    };
    unpack_where(image, root, &wanted)
}

/// What an entry is judged by when only some are unpacked: its path inside the root and its
/// kind (a symbolic link, a file).
pub type Wanted<'a> = dyn Fn(&Path, tar::EntryType) -> bool + 'a;

/// Unpacks only the entries `wanted` takes (directories above them are made as needed).
pub fn unpack_where(image: &Image, root: &Path, wanted: &Wanted) -> Result<()> {
    std::fs::create_dir_all(root).map_err(|e| Error::writing(root, e))?;
    let layers = image.layers();
    let listed = strings(&image.config()?["rootfs"]["diff_ids"]).len();
    if listed != layers.len() {
        return Err(Error::image(
            image.describe(),
            format!(
                "the config lists {listed} diff_ids for {} layers",
                layers.len()
            ),
        ));
    }
    match apply_layers(image, root, wanted, true)
        .into_iter()
        .find_map(|r| r.err())
    {
        Some(e) => Err(Error::image(image.describe(), e)),
        None => Ok(()),
    }
}

/// Applies the layers to `root` in order, with their progress, and returns each one's result;
/// with `stop_at_error`, none after the first that fails.
fn apply_layers(
    image: &Image,
    root: &Path,
    wanted: &Wanted,
    stop_at_error: bool,
) -> Vec<std::result::Result<(), String>> {
    let layers = image.layers();
    let progress = crate::progress::Progress::new(
        "unpacking the layers",
        crate::progress::Unit::Bytes,
        Some(layers.iter().map(|l| l.size()).sum()),
    );
    let mut results = Vec::with_capacity(layers.len());
    for layer in &layers {
        let result = layer.read_tar(true, |archive, end| apply(archive, end, root, wanted));
        progress.inc(layer.size());
        let failed = result.is_err();
        results.push(result);
        if failed && stop_at_error {
            break;
        }
    }
    progress.finish();
    results
}

/// Applies one layer's tar stream to `root`; `end` is its [`Padded`] reader's.
fn apply<R: Read>(
    archive: &mut tar::Archive<R>,
    end: &End,
    root: &Path,
    wanted: &Wanted,
) -> std::io::Result<()> {
    let as_root = unsafe { libc::geteuid() } == 0;
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_preserve_ownerships(as_root);
    archive.set_overwrite(true);
    archive.set_unpack_xattrs(false);
    for entry in archive.entries()? {
        let mut entry = entry?;
        end.saw(&entry);
        let path = entry.path()?.into_owned();
        let inside = within(&path).ok_or_else(|| {
            std::io::Error::other(format!("entry `{}` escapes the root", path.display()))
        })?;
        let name = inside
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        // Deletions happen only in a directory that really lies inside the root: a lower
        // layer's symlink (`etc -> /`) must not turn a whiteout into a deletion on the host.
        let parent = resolved_parent(root, &inside)?;
        if name == OPAQUE {
            if let Some(parent) = parent {
                clear_dir(&parent)?;
            }
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            if let Some(parent) = parent {
                remove_any(&parent.join(hidden))?;
            }
            continue;
        }
        // Whiteouts apply wherever they are (what they delete may not be here at all); other
        // entries only where wanted. The bytes of those skipped are still read and hashed.
        if !wanted(&inside, entry.header().entry_type()) {
            continue;
        }
        // A lower layer's entry of another kind at this path gives way (a file replacing a
        // directory, a directory replacing a link); a directory over a directory merges.
        let Some(parent) = parent else {
            entry.unpack_in(root)?;
            continue;
        };
        let target = parent.join(&name);
        if let Ok(meta) = std::fs::symlink_metadata(&target) {
            let entry_is_dir = entry.header().entry_type().is_dir();
            if !(entry_is_dir && meta.is_dir()) {
                remove_any(&target)?;
            }
        }
        entry.unpack_in(root)?;
    }
    end.check()
}

/// A relative path without `.` or `..` that stays inside the root; None when it would leave.
pub(super) fn within(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// The entry's parent directory, resolved through links, when it exists; an error when it
/// resolves outside the root.
fn resolved_parent(root: &Path, inside: &Path) -> std::io::Result<Option<PathBuf>> {
    let parent = root.join(inside.parent().unwrap_or(Path::new("")));
    let Ok(real) = parent.canonicalize() else {
        return Ok(None);
    };
    if real.starts_with(root.canonicalize()?) {
        Ok(Some(real))
    } else {
        Err(std::io::Error::other(format!(
            "entry `{}` lies under a link that leaves the root",
            inside.display()
        )))
    }
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn clear_dir(dir: &Path) -> std::io::Result<()> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in read {
        remove_any(&entry?.path())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tarstream::Padded;

    fn layer(entries: &[(&str, Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, content) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            match content {
                Some(text) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(text.len() as u64);
                    h.set_mode(0o644);
                    b.append_data(&mut h, path, text.as_bytes()).unwrap();
                }
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    h.set_mode(0o755);
                    b.append_data(&mut h, path, std::io::empty()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    fn apply_all(root: &Path, layers: &[Vec<u8>]) -> std::io::Result<()> {
        for l in layers {
            let (reader, end) = Padded::new(l.as_slice());
            apply(&mut tar::Archive::new(reader), &end, root, &|_, _| true)?;
        }
        Ok(())
    }

    #[test]
    fn whiteouts_delete_and_opaque_directories_hide_lower_layers() {
        let dir = tempfile::tempdir().unwrap();
        let lower = layer(&[
            ("etc/", None),
            ("etc/a", Some("a")),
            ("etc/b", Some("b")),
            ("opt/", None),
            ("opt/x", Some("x")),
        ]);
        let upper = layer(&[
            ("etc/.wh.a", Some("")),
            ("opt/", None),
            ("opt/.wh..wh..opq", Some("")),
            ("opt/y", Some("y")),
        ]);
        apply_all(dir.path(), &[lower, upper]).unwrap();
        assert!(!dir.path().join("etc/a").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("etc/b")).unwrap(),
            "b"
        );
        assert!(!dir.path().join("opt/x").exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("opt/y")).unwrap(),
            "y"
        );
        assert!(!dir.path().join("opt/.wh..wh..opq").exists());
    }

    #[test]
    fn a_file_replaces_a_directory_of_a_lower_layer() {
        let dir = tempfile::tempdir().unwrap();
        let lower = layer(&[("d/", None), ("d/inner", Some("1"))]);
        let upper = layer(&[("d", Some("now a file"))]);
        apply_all(dir.path(), &[lower, upper]).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("d")).unwrap(),
            "now a file"
        );
    }

    #[test]
    fn a_whiteout_under_a_link_out_of_the_root_deletes_nothing_outside() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("precious"), "keep").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("etc")).unwrap();
        let upper = layer(&[("etc/.wh.precious", Some(""))]);
        assert!(apply_all(dir.path(), &[upper]).is_err());
        assert!(outside.path().join("precious").exists());
    }

    #[test]
    fn escaping_entries_are_refused() {
        assert_eq!(within(Path::new("../x")), None);
        assert_eq!(within(Path::new("a/../../x")), None);
        assert_eq!(within(Path::new("/etc/x")), Some(PathBuf::from("etc/x")));
        assert_eq!(within(Path::new("./a/./b")), Some(PathBuf::from("a/b")));
    }
}
