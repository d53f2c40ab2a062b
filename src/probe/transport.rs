//! Whether NCCL's IB transport can load here. NCCL opens libibverbs.so.1 by name when it makes
//! a communicator, and libibverbs opens the NIC's provider; when either is missing NCCL says
//! so in one INFO line and runs over TCP sockets. The probe runs with the image's loader and
//! library path, so opening the same names here finds what NCCL would find, without a GPU.

use super::env::Discovery;
use super::report::Report;
use crate::nccl::needs::{self, Library};
use crate::verdict::Status;

/// The phase the checks report under.
const PHASE: &str = "compatibility";

/// The RDMA devices of the node (`mlx5_0`, ...), as the kernel lists them; none where /sys
/// does not show them.
pub fn rdma_devices(disc: &Discovery) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(disc.at("/sys/class/infiniband"))
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// One check per library NCCL's IB transport needs, where the image's NCCL settings ask for
/// that transport or the node has an RDMA device; nothing otherwise.
pub fn check(disc: &Discovery, report: &mut Report) {
    let preset = super::image_preset(disc);
    let devices = rdma_devices(disc);
    report.fact("rdma_devices", serde_json::json!(devices));
    let Some(need) = needs::of_node(&preset, &devices) else {
        return;
    };
    let asked = if preset_asks(&preset) {
        format!("the image sets {}", need.because)
    } else {
        format!("the node has {}", devices.join(", "))
    };
    for lib in need.libraries {
        let (status, found) = match open(disc, lib) {
            Ok(path) => (Status::Pass, format!("loads {path}")),
            Err(said) => (
                Status::Fail,
                format!(
                    "{said}: NCCL would run across nodes over TCP sockets; the image needs \
                     `system: [{}]`",
                    lib.package
                ),
            ),
        };
        report.push(
            PHASE,
            lib.soname,
            status,
            format!("{} ({asked}): {found}", lib.role),
        );
    }
}

/// Whether the settings alone ask for the IB transport.
fn preset_asks(preset: &[(String, String)]) -> bool {
    needs::of(preset).is_some()
}

/// Opens `lib` by its soname as NCCL does and returns the file the loader mapped, or the
/// loader's own words. Probing a tree that is not this process's root, the library is only
/// looked up there: loading it would run the host's loader on the tree's files.
fn open(disc: &Discovery, lib: &Library) -> Result<String, String> {
    if disc.at("/") != std::path::Path::new("/") {
        return disc
            .find_lib(lib.soname)
            .map(|f| {
                format!(
                    "{} (found, not loaded: the probe reads a tree)",
                    f.path.display()
                )
            })
            .ok_or_else(|| format!("{} is not in the tree's library path", lib.soname));
    }
    // Loading a library runs its constructors; libibverbs' and its providers' only read
    // their configuration.
    let loaded =
        unsafe { libloading::Library::new(lib.soname) }.map_err(|e| super::loader::message(&e))?;
    let stem = lib.soname.split(".so").next().unwrap_or(lib.soname);
    let path = mapped(&format!("/{stem}.so"));
    drop(loaded);
    Ok(path.unwrap_or_else(|| lib.soname.to_string()))
}

/// The first file of this process's mappings whose path contains `part`.
fn mapped(part: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains(part))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_devices_are_read_from_sys_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let disc = Discovery::under(dir.path());
        assert!(rdma_devices(&disc).is_empty());
        for name in ["mlx5_1", "mlx5_0"] {
            std::fs::create_dir_all(dir.path().join("sys/class/infiniband").join(name)).unwrap();
        }
        assert_eq!(rdma_devices(&disc), ["mlx5_0", "mlx5_1"]);
    }

    #[test]
    fn a_library_is_looked_up_not_loaded_in_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        let disc = Discovery::under(dir.path());
        let lib = &needs::IB_LIBRARIES[0];
        let e = open(&disc, lib).unwrap_err();
        assert!(
            e.contains("libibverbs.so.1 is not in the tree's library path"),
            "{e}"
        );
        let libdir = dir.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&libdir).unwrap();
        std::fs::write(libdir.join("libibverbs.so.1"), b"\x7fELF").unwrap();
        let found = open(&disc, lib).unwrap();
        assert!(
            found.ends_with("libibverbs.so.1 (found, not loaded: the probe reads a tree)"),
            "{found}"
        );
    }

    #[test]
    fn a_missing_library_fails_in_the_loaders_words() {
        // This process's root: the loader is asked, and a soname nothing provides fails.
        let disc = Discovery::system();
        let absent = Library {
            soname: "libgpubake-absent.so.1",
            role: "a library no system has",
            package: "absent",
        };
        let e = open(&disc, &absent).unwrap_err();
        assert!(
            e.contains("libgpubake-absent.so.1: cannot open shared object file"),
            "{e}"
        );
        // And one every glibc system has is found where it was mapped.
        let libc = Library {
            soname: "libc.so.6",
            role: "the C library",
            package: "libc6",
        };
        let path = open(&disc, &libc).unwrap();
        assert!(path.starts_with('/') && path.contains("/libc.so"), "{path}");
    }
}
