//! What an interrupted command leaves behind. Temporary files and directories (a staged base,
//! an unpacked bundle, a blob being written) are removed when their owner drops them, but
//! SIGINT and SIGTERM end the process without running destructors. Each such path is
//! registered here while it exists; on either signal they are removed before the process
//! exits with 130, as a shell reports an interrupted command.

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
