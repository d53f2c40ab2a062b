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

/// Removes every registered path; returns how many there were.
fn remove_all() -> usize {
    let paths = std::mem::take(&mut *SCRATCH.lock().unwrap_or_else(|e| e.into_inner()));
    remove(&paths);
    paths.len()
}

fn remove(paths: &[PathBuf]) {
    for p in paths {
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(p)
        } else {
            std::fs::remove_file(p)
        };
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
}

impl ScratchDir {
    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A new scratch directory named `PREFIX…` under `parent` (the system's temporary directory
/// when None).
pub fn scratch_dir(parent: Option<&Path>, prefix: &str) -> std::io::Result<ScratchDir> {
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix(prefix);
        b
    };
    let dir = match parent {
        Some(p) => builder.tempdir_in(p)?,
        None => builder.tempdir()?,
    };
    Ok(ScratchDir {
        _guard: Scratch::new(dir.path()),
        dir,
    })
}
