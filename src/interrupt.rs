//! What an interrupted or killed command leaves behind. Temporary files and directories (a
//! staged base, an unpacked bundle, a blob being written) are removed when their owner drops
//! them, but SIGINT and SIGTERM end the process without running destructors. Each such path is
//! registered here while it exists; on either signal they are removed before the process
//! exits with 130, as a shell reports an interrupted command. SIGKILL runs nothing at all, so
//! each temporary file and directory is also locked by its owner while it lives: the next
//! process to write there removes the ones whose lock is free ([`temp_file`],
//! [`scratch_dir`]).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Installs the handler (once; later calls do nothing).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // A process that cannot install it (a handler already set by an embedding program)
        // keeps the default behaviour.
        let _ = ctrlc::set_handler(|| {
            let removed = remove_all();
            if removed > 0 {
                eprintln!("interrupted: removed {removed} temporary files and directories");
            } else {
                eprintln!("interrupted");
            }
            std::process::exit(130);
        });
    });
}

/// Removes every registered path; returns how many there were. The register stays locked
/// from here to the process's exit, so nothing registers after the sweep.
fn remove_all() -> usize {
    let mut list = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    let paths = std::mem::take(&mut *list);
    remove(&paths);
    std::mem::forget(list);
    paths.len()
}

fn remove(paths: &[PathBuf]) {
    for p in paths {
        // The interrupted thread may still add an entry to a directory being removed (until
        // it blocks on the register): a few tries outlast it.
        for _ in 0..5 {
            let done = if p.is_dir() {
                std::fs::remove_dir_all(p)
            } else {
                std::fs::remove_file(p)
            };
            if done.is_ok() || !p.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
fn registered(path: &Path) -> bool {
    SCRATCH
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|p| p == path)
}

/// Keeps `path` registered for removal on interrupt until dropped.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Registers `path`.
    pub fn new(path: &Path) -> Self {
        SCRATCH
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path.to_path_buf());
        Scratch {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let mut list = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = list.iter().rposition(|p| *p == self.path) {
            list.remove(i);
        }
    }
}

/// What a command is making at `path`: removed if the command fails (the guard is dropped)
/// as it is removed if the command is interrupted, and kept once [`Staged::keep`] says it is
/// complete.
#[derive(Debug)]
pub struct Staged {
    scratch: Option<Scratch>,
}

impl Staged {
    /// Registers `path` for removal unless kept.
    pub fn new(path: &Path) -> Self {
        Staged {
            scratch: Some(Scratch::new(path)),
        }
    }

    /// The work is complete: the path stays.
    pub fn keep(mut self) {
        self.scratch.take();
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(scratch) = self.scratch.take() {
            let path = scratch.path.clone();
            drop(scratch);
            remove(&[path]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Other tests of this process register their own scratch, so these tests look only at
    // their paths and never empty the whole register.
    #[test]
    fn a_path_is_registered_while_its_guard_lives() {
        let dir = tempfile::tempdir().unwrap();
        let staged = dir.path().join("staged");
        std::fs::create_dir_all(staged.join("inner")).unwrap();
        let guard = Scratch::new(&staged);
        assert!(registered(&staged));
        drop(guard);
        assert!(!registered(&staged));
        remove(std::slice::from_ref(&staged));
        assert!(!staged.exists());
    }

    #[test]
    fn staged_work_is_removed_on_failure_and_kept_when_complete() {
        let dir = tempfile::tempdir().unwrap();
        let failed = dir.path().join("failed");
        std::fs::create_dir_all(failed.join("blobs")).unwrap();
        drop(Staged::new(&failed));
        assert!(!failed.exists());
        assert!(!registered(&failed));
        let done = dir.path().join("done");
        std::fs::create_dir_all(&done).unwrap();
        Staged::new(&done).keep();
        assert!(done.exists());
        assert!(!registered(&done));
    }

    #[test]
    fn scratch_dirs_killed_processes_left_are_removed_and_live_ones_kept() {
        let parent = tempfile::tempdir().unwrap();
        let live = scratch_dir(Some(parent.path()), ".gpubake-t-").unwrap();
        // What a process killed by SIGKILL leaves: the directory and its lock file, unlocked.
        let orphan = parent.path().join(".gpubake-t-orphan");
        std::fs::create_dir_all(orphan.join("rootfs")).unwrap();
        std::fs::write(orphan.join(OWNER_LOCK), "").unwrap();
        // Another kind of directory, and one without a lock file, are not touched.
        let other = parent.path().join(".gpubake-u-orphan");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join(OWNER_LOCK), "").unwrap();
        let unknown = parent.path().join(".gpubake-t-nolock");
        std::fs::create_dir_all(&unknown).unwrap();
        let next = scratch_dir(Some(parent.path()), ".gpubake-t-").unwrap();
        assert!(!orphan.exists());
        assert!(live.path().exists() && next.path().exists());
        assert!(other.exists() && unknown.exists());
        let live_path = live.path().to_path_buf();
        drop(live);
        assert!(!live_path.exists());
    }

    #[test]
    fn a_scratch_dir_is_registered_and_removed_with_its_owner() {
        let scratch = scratch_dir(None, ".gpubake-test-").unwrap();
        let path = scratch.path().to_path_buf();
        assert!(registered(&path));
        drop(scratch);
        assert!(!registered(&path));
        assert!(!path.exists());
    }
}

/// A temporary directory removed when dropped and, if the process is interrupted first, by
/// the signal handler.
#[derive(Debug)]
pub struct ScratchDir {
    _guard: Scratch,
    dir: tempfile::TempDir,
    /// Locked while the directory lives; dropped after it is removed.
    _owner: std::fs::File,
}

impl ScratchDir {
    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Creates something temporary with `create` and registers the path `path` gives, holding
/// the register while both happen: a signal arriving between the creation and the
/// registration would otherwise leave it behind.
pub fn guarded<T>(
    create: impl FnOnce() -> std::io::Result<T>,
    path: impl Fn(&T) -> &Path,
) -> std::io::Result<(T, Scratch)> {
    let mut list = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    let made = create()?;
    let p = path(&made).to_path_buf();
    list.push(p.clone());
    Ok((made, Scratch { path: p }))
}

/// The file a scratch directory's owner keeps locked while it lives. SIGKILL leaves the
/// directory behind (an image archive, a runtime bundle: megabytes to gigabytes), but frees
/// the lock, so the next scratch directory of that kind finds and removes it.
const OWNER_LOCK: &str = ".gpubake-owner";

/// Removes `PREFIX…` directories under `parent` whose owner lock nobody holds.
fn sweep_orphans(parent: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let path = entry.path();
        let Ok(owner) = std::fs::File::open(path.join(OWNER_LOCK)) else {
            continue;
        };
        if owner.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Takes the owner lock of `dir`. The file is locked before it takes its name, so a sweep
/// never finds a live directory's lock free.
fn own(dir: &Path) -> std::io::Result<std::fs::File> {
    let staged = dir.join(".gpubake-owner.new");
    let file = std::fs::File::create(&staged)?;
    file.lock()?;
    std::fs::rename(&staged, dir.join(OWNER_LOCK))?;
    Ok(file)
}

/// A new scratch directory named `PREFIX…` under `parent` (the system's temporary directory
/// when None). Directories of the same prefix that killed processes left there are removed
/// first.
pub fn scratch_dir(parent: Option<&Path>, prefix: &str) -> std::io::Result<ScratchDir> {
    sweep_orphans(
        &parent.map_or_else(std::env::temp_dir, Path::to_path_buf),
        prefix,
    );
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix(prefix);
        b
    };
    let (dir, guard) = guarded(
        || match parent {
            Some(p) => builder.tempdir_in(p),
            None => builder.tempdir(),
        },
        |d| d.path(),
    )?;
    let owner = own(dir.path())?;
    Ok(ScratchDir {
        _guard: guard,
        dir,
        _owner: owner,
    })
}

/// The name of every temporary file gpubake writes beside what it becomes (a blob, an index,
/// a record, an archive, a key): this prefix and twelve random characters. Its writer holds
/// an exclusive lock on it from before it takes this name until it is renamed or removed.
/// SIGKILL frees the lock and leaves the file, so one whose lock is free is a killed
/// process's leftover, whatever its age: [`sweep_temp_files`] removes it.
pub const TEMP_FILE_PREFIX: &str = ".gpubake-tmp-";

/// A temporary file's name until its writer has locked it. Only a process killed in that
/// instant leaves one, empty; it is removed once a minute old.
const UNLOCKED_PREFIX: &str = ".gpubake-new-";

/// A new temporary file in `dir` ([`TEMP_FILE_PREFIX`]), locked by this process while it is
/// open, deleted when dropped and, on SIGINT or SIGTERM, by the handler.
pub fn temp_file(dir: &Path) -> std::io::Result<(tempfile::NamedTempFile, Scratch)> {
    guarded(|| owned_temp_file(dir), |t| t.path())
}

fn owned_temp_file(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let staged = tempfile::Builder::new()
        .prefix(UNLOCKED_PREFIX)
        .rand_bytes(12)
        .tempfile_in(dir)?;
    staged.as_file().lock()?;
    let (file, staged_path) = staged.into_parts();
    let random = staged_path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(UNLOCKED_PREFIX))
        .expect("tempfile names its files prefix and random characters")
        .to_string();
    let owned = dir.join(format!("{TEMP_FILE_PREFIX}{random}"));
    // On failure the staged path is dropped, which removes the file.
    std::fs::rename(&staged_path, &owned)?;
    // The staged name no longer exists: there is nothing for its guard to remove.
    let _ = staged_path.keep();
    let path = tempfile::TempPath::try_from_path(&owned).inspect_err(|_| {
        let _ = std::fs::remove_file(&owned);
    })?;
    Ok(tempfile::NamedTempFile::from_parts(file, path))
}

/// Which names of a directory an earlier release gave its temporary files there (it did not
/// lock them, so they are taken by age).
pub type LegacyTempName = fn(&str) -> bool;

/// Temporary files killed processes left in one directory.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers {
    /// Each file, with its size in bytes.
    pub files: Vec<(PathBuf, u64)>,
}

impl Leftovers {
    /// Their bytes in all.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, size)| size).sum()
    }

    /// Removes them; a file already gone is not an error (another sweep took it). A failure
    /// names the file.
    pub fn remove(&self) -> Result<(), (PathBuf, std::io::Error)> {
        for (path, _) in &self.files {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err((path.clone(), e));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The temporary files in `dir` no live process owns: [`TEMP_FILE_PREFIX`] files whose lock
/// is free, files still under their unlocked first name after a minute, and what `legacy`
/// names (the unlocked temporary files of earlier releases), once a minute old. A file that
/// is not gpubake's is never taken, nor a directory.
pub fn temp_leftovers(dir: &Path, legacy: &dyn Fn(&str) -> bool) -> Leftovers {
    let mut found = Leftovers::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    let minute_old = |meta: &std::fs::Metadata| {
        meta.modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(60))
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let owned = name.starts_with(TEMP_FILE_PREFIX);
        if !owned && !name.starts_with(UNLOCKED_PREFIX) && !legacy(&name) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let dead = if owned {
            // Opening it takes no lock; trying one tells whether its writer lives.
            std::fs::File::open(entry.path()).is_ok_and(|f| f.try_lock().is_ok())
        } else {
            minute_old(&meta)
        };
        if dead {
            found.files.push((entry.path(), meta.len()));
        }
    }
    found.files.sort();
    found
}

/// Removes what [`temp_leftovers`] finds in `dir`, quietly: a sweep that fails leaves the
/// files for `gpubake gc`.
pub fn sweep_temp_files(dir: &Path, legacy: &dyn Fn(&str) -> bool) {
    let _ = temp_leftovers(dir, legacy).remove();
}

#[cfg(test)]
mod temp_file_tests {
    use super::*;

    #[test]
    fn a_temp_file_is_owned_while_open_and_a_leftover_once_its_owner_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let none = |_: &str| false;
        let (live, _guard) = temp_file(dir.path()).unwrap();
        let name = live
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with(TEMP_FILE_PREFIX) && name.len() == TEMP_FILE_PREFIX.len() + 12);
        assert!(temp_leftovers(dir.path(), &none).files.is_empty());
        // What SIGKILL leaves: the name, with no lock on it (a file of the same name).
        let dead = dir.path().join(format!("{TEMP_FILE_PREFIX}abcdefghijkl"));
        std::fs::write(&dead, b"half a blob").unwrap();
        // Files that are not gpubake's temporary files are never taken.
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
        std::fs::write(dir.path().join(".gpubake-lock"), b"").unwrap();
        std::fs::create_dir(dir.path().join(format!("{TEMP_FILE_PREFIX}dir000000000"))).unwrap();
        let found = temp_leftovers(dir.path(), &none);
        assert_eq!(found.files, vec![(dead.clone(), 11)]);
        assert_eq!(found.bytes(), 11);
        sweep_temp_files(dir.path(), &none);
        assert!(!dead.exists() && live.path().exists());
        // Once its owner drops it, nothing is left to sweep.
        let path = live.path().to_path_buf();
        drop(live);
        assert!(!path.exists());
    }

    #[test]
    fn unlocked_and_legacy_names_wait_a_minute() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = |n: &str| n.starts_with(".tmp-");
        let fresh = dir.path().join(".tmp-fresh1");
        let old = dir.path().join(".tmp-old123");
        let staged = dir.path().join(format!("{UNLOCKED_PREFIX}abcdefghijkl"));
        for p in [&fresh, &old, &staged] {
            std::fs::write(p, b"x").unwrap();
        }
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
        for p in [&old, &staged] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(past)
                .unwrap();
        }
        let found: Vec<_> = temp_leftovers(dir.path(), &legacy)
            .files
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(found, vec![staged, old]);
        assert!(temp_leftovers(dir.path(), &|_| false).files.len() == 1);
    }
}
