//! File writes that never leave a half-written file: write a temporary file beside the
//! target, flush it to disk, then rename it over the target.

use crate::error::{Error, Result};
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where an output named `path` is really written: a symlink is written through (the link
/// stays, its target is replaced, as `cp` and a shell's `>` do), and anything that is not a
/// regular file (a device, a FIFO, a directory) is refused, since the atomic rename would
/// replace the node itself.
pub fn output_target(path: &Path) -> Result<std::path::PathBuf> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(path.to_path_buf()),
        Err(e) => return Err(Error::writing(path, e)),
    };
    if meta.file_type().is_symlink() {
        let link = std::fs::read_link(path).map_err(|e| Error::reading(path, e))?;
        let target = match path.parent() {
            Some(dir) if link.is_relative() => dir.join(link),
            _ => link,
        };
        // A chain of links is followed link by link; a loop ends in the OS's own error.
        return match std::fs::canonicalize(&target) {
            Ok(real) => output_target(&real),
            Err(_) => output_target(&target),
        };
    }
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    let what = if kind.is_file() {
        return Ok(path.to_path_buf());
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_fifo() {
        "a FIFO"
    } else {
        "a special file"
    };
    Err(Error::Usage(format!(
        "{}: is {what}, not a file; outputs are written by replacing a file, which would \
         replace {what} here",
        path.display()
    )))
}

/// Reads a whole file that should be small, refusing it unread past `max` bytes: a spec or a
/// passwd file of gigabytes is a mistake or an attack, and reading it whole would exhaust memory.
pub fn read_capped(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    File::open(path)?.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("larger than the {max} bytes gpubake reads of such a file"),
        ));
    }
    Ok(bytes)
}

/// Replaces `path` with `bytes` atomically, keeping its mode (see [`match_mode`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let target = output_target(path)?;
    let path = target.as_path();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // The folder first: tempfile's own error names the temporary file it could not make,
    // which the user never asked for.
    std::fs::metadata(dir)
        .and_then(|m| {
            m.is_dir()
                .then_some(())
                .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOTDIR))
        })
        .map_err(|e| Error::writing(dir, e))?;
    let (mut tmp, _scratch) =
        crate::interrupt::temp_file(dir).map_err(|e| Error::writing(dir, e))?;
    tmp.write_all(bytes)
        .map_err(|e| Error::writing(tmp.path(), e))?;
    match_mode(tmp.as_file(), path).map_err(|e| Error::writing(tmp.path(), e))?;
    tmp.as_file()
        .sync_all()
        .map_err(|e| Error::writing(tmp.path(), e))?;
    tmp.persist(path)
        .map_err(|e| Error::writing(path, e.error))?;
    Ok(())
}

/// How a file's content was put in another place by [`place_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// A clone whose blocks are shared copy-on-write (`FICLONE`): no data written, and a
    /// change to either file is that file's alone.
    Reflink,
    /// The bytes written again.
    Copy,
    /// A hard link: the same file under two names, so a change made in place to one is a
    /// change to the other.
    Link,
}

impl Placement {
    /// The word `--timings` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Reflink => "reflink",
            Placement::Copy => "copy",
            Placement::Link => "link",
        }
    }
}

/// Puts the content of `src` at `dst`, atomically, for files never changed in place such as
/// content-addressed blobs: a reflink where the filesystem makes one, else a copy, through a
/// temporary file in `temp_dir` (on `dst`'s filesystem) renamed over `dst`. With `link`, a
/// hard link comes first, which writes nothing but leaves the two names one file. `check`
/// reads the placed file (or, before a link, `src`) and refuses it with an error: what is
/// handed on is what was checked. A new file gets the mode the umask gives (as
/// [`match_mode`]); where `src` has another, it is not linked (one inode has one mode).
pub fn place_file(
    src: &Path,
    dst: &Path,
    temp_dir: &Path,
    link: bool,
    check: &dyn Fn(&Path) -> std::io::Result<()>,
) -> std::io::Result<Placement> {
    let mode = 0o666 & !umask();
    let from = File::open(src)?;
    if link && from.metadata()?.permissions().mode() & 0o7777 == mode {
        check(src)?;
        // A file already at `dst` (a damaged one, since callers look first) is replaced below.
        if std::fs::hard_link(src, dst).is_ok() {
            return Ok(Placement::Link);
        }
    }
    let (tmp, _scratch) = crate::interrupt::temp_file(temp_dir)?;
    let to = tmp.as_file();
    to.set_permissions(std::fs::Permissions::from_mode(mode))?;
    // SAFETY: both descriptors are open for the call; FICLONE only reads them.
    let cloned = unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE as _, from.as_raw_fd()) } == 0;
    let placement = if cloned {
        Placement::Reflink
    } else {
        std::io::copy(&mut &from, &mut &*to)?;
        Placement::Copy
    };
    check(tmp.path())?;
    to.sync_all()?;
    tmp.persist(dst).map_err(|e| e.error)?;
    Ok(placement)
}

/// Gives `file`, a temporary file about to be renamed over `target`, the mode it should end
/// with: the mode of the file it replaces, or for a new file what `open(2)` would have given
/// (0666 less the umask). tempfile creates its files 0600, which left every output, and
/// every blob of a layout, unreadable to anyone but the writer.
pub fn match_mode(file: &File, target: &Path) -> std::io::Result<()> {
    let mode = match std::fs::metadata(target) {
        Ok(meta) => meta.permissions().mode() & 0o7777,
        Err(_) => 0o666 & !umask(),
    };
    file.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// The process umask, read once: umask(2) reads it only by setting it, so it is set and put
/// back at once, before other threads of this process create files.
fn umask() -> u32 {
    static MASK: OnceLock<u32> = OnceLock::new();
    *MASK.get_or_init(|| {
        // SAFETY: umask(2) cannot fail and only swaps the process's mask; the second call
        // restores the value the first returned.
        let mask: u32 = unsafe { libc::umask(0o022) };
        unsafe { libc::umask(mask) };
        mask
    })
}

/// gpubake's cache directory, which holds the wheels, the .debs and the registry blobs:
/// `GPUBAKE_CACHE_DIR`, else `$XDG_CACHE_HOME/gpubake`, else `~/.cache/gpubake`.
pub fn cache_root() -> Result<PathBuf> {
    cache_root_from(|key| std::env::var_os(key))
}

fn cache_root_from(var: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf> {
    let set = |key: &str| var(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set("GPUBAKE_CACHE_DIR") {
        return Ok(dir);
    }
    // The XDG base directory spec says a relative value is invalid and is to be ignored.
    if let Some(dir) = set("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
        return Ok(dir.join("gpubake"));
    }
    if let Some(home) = set("HOME") {
        return Ok(home.join(".cache").join("gpubake"));
    }
    Err(Error::Environment(
        "no place for gpubake's cache (wheels, .debs, registry blobs): set GPUBAKE_CACHE_DIR (or \
         XDG_CACHE_HOME or HOME)"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_files_are_read_and_large_ones_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("passwd");
        std::fs::write(&file, vec![b'x'; 64]).unwrap();
        assert_eq!(read_capped(&file, 64).unwrap().len(), 64);
        let err = read_capped(&file, 63).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(err.to_string().contains("63 bytes"), "{err}");
    }

    #[test]
    fn links_are_written_through_and_devices_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        std::fs::write(&real, "old").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink("real.json", &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        let err = output_target(Path::new("/dev/null"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is a device"), "{err}");
        assert!(output_target(dir.path()).is_err());
    }

    #[test]
    fn replaces_the_whole_file_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("lock.yaml");
        std::fs::write(&target, "old content that is longer").unwrap();
        write_atomic(&target, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_replaced_file_keeps_its_mode_and_a_new_one_follows_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let kept = dir.path().join("kept");
        std::fs::write(&kept, "old").unwrap();
        std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&kept, b"new").unwrap();
        assert_eq!(mode(&kept), 0o640);
        let new = dir.path().join("new");
        write_atomic(&new, b"new").unwrap();
        assert_eq!(mode(&new), 0o666 & !umask());
    }

    #[test]
    fn the_root_follows_the_environment_in_order() {
        fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
            move |key| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| OsString::from(v))
            }
        }
        let all = [
            ("GPUBAKE_CACHE_DIR", "/c"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(cache_root_from(env(&all)).unwrap(), PathBuf::from("/c"));
        let no_own = [
            ("GPUBAKE_CACHE_DIR", ""),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(
            cache_root_from(env(&no_own)).unwrap(),
            PathBuf::from("/x/gpubake")
        );
        let relative_xdg = [("XDG_CACHE_HOME", "rel"), ("HOME", "/h")];
        assert_eq!(
            cache_root_from(env(&relative_xdg)).unwrap(),
            PathBuf::from("/h/.cache/gpubake")
        );
        assert_eq!(cache_root_from(env(&[])).unwrap_err().exit_code(), 3);
    }
}
