//! The prefetch of an eStargz image from a record of the job's start-up: which of the files
//! it read are fetched before the container starts, and which are left to be read on demand.
//!
//! The rule: a file is prefetched whole when the start-up touched at least half of it, or
//! when it is no larger than one chunk (a request for part of it would cost about as much as
//! the whole). A large library of which the start-up mapped a few pages (libtorch_cuda.so:
//! 126 of 456 MB on an H200) is left lazy: prefetching it whole would move most of the
//! image before the first instruction runs, which is what makes `ctr-remote image optimize`
//! slow for training images. `benches/lazy.sh` measures this rule against a whole-file
//! prefetch of every file the start-up touched.

use crate::error::{Error, Location, Result};
use crate::image::estargz::CHUNK;
use crate::image::layer::Prefetch;
use crate::startup::{SITE_PACKAGES, StartupRecord};
use std::collections::BTreeMap;
use std::path::Path;

/// Whether the start-up read enough of a file to fetch it whole.
pub fn fetch_whole(size: u64, read: u64) -> bool {
    size <= CHUNK || read.saturating_mul(2) >= size
}

/// The prefetch for a stack installed into `site_packages` (the image's, without a leading
/// `/`), in the order the record gives.
pub fn plan(record: &StartupRecord, site_packages: &str) -> Prefetch {
    let mut prefetch = Prefetch::default();
    for f in &record.files {
        let path = image_path(&f.path, site_packages);
        if fetch_whole(f.size, f.read) {
            prefetch.fetched.push(path);
        } else {
            prefetch.lazy.push(path);
        }
    }
    prefetch
}

/// `site-packages/REL` as the image holds it.
fn image_path(recorded: &str, site_packages: &str) -> String {
    let rel = recorded.strip_prefix(SITE_PACKAGES).unwrap_or(recorded);
    format!("{}/{rel}", site_packages.trim_matches('/'))
}

/// Refuses a record that names a file the stack does not install (`held`: every path its
/// layers hold): it was taken with other packages, and the layers would be laid out for
/// another image.
pub fn check_held<V>(
    record: &StartupRecord,
    at: &Path,
    site_packages: &str,
    held: &BTreeMap<String, V>,
) -> Result<()> {
    let missing: Vec<(usize, &str)> = record
        .files
        .iter()
        .enumerate()
        .filter(|(_, f)| !held.contains_key(&image_path(&f.path, site_packages)))
        .map(|(i, f)| (i, f.path.as_str()))
        .collect();
    let Some(&(first, path)) = missing.first() else {
        return Ok(());
    };
    Err(Error::invalid(
        Location::of_file(at),
        Some(format!("files[{first}].path")),
        format!(
            "`{path}` is not installed by this image's Python stack{}: the record was taken \
             with other packages",
            match missing.len() {
                1 => String::new(),
                n => format!(" (nor are {} more of the record's files)", n - 1),
            }
        ),
        Some(
            "record the start-up again in an image of this lock (`gpubake probe \
             --record-startup FILE`)"
                .into(),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::startup::{FORMAT, FileRead};

    fn record(files: &[(&str, u64, u64)]) -> StartupRecord {
        StartupRecord {
            format: FORMAT.into(),
            torch: "2.11.0+cu130".into(),
            python: "3.12.3".into(),
            steps: vec!["import torch".into()],
            gpu: None,
            files: files
                .iter()
                .map(|&(path, size, read)| FileRead {
                    path: path.into(),
                    size,
                    read,
                })
                .collect(),
        }
    }

    #[test]
    fn small_files_and_files_read_in_large_part_are_fetched_the_rest_left_lazy() {
        let mib = 1 << 20;
        let r = record(&[
            ("site-packages/torch/__init__.py", 80_000, 80_000),
            (
                "site-packages/torch/lib/libtorch_cuda.so",
                456 * mib,
                126 * mib,
            ),
            ("site-packages/torch/_C.so", 4 * mib, 4096),
            (
                "site-packages/torch/lib/libtorch_cpu.so",
                450 * mib,
                225 * mib,
            ),
            ("site-packages/torch/lib/libc10.so", 5 * mib, 2 * mib),
        ]);
        let p = plan(&r, "/opt/gpubake/venv/lib/python3.12/site-packages");
        let at = "opt/gpubake/venv/lib/python3.12/site-packages/torch";
        assert_eq!(
            p.fetched,
            [
                format!("{at}/__init__.py"),
                format!("{at}/_C.so"),
                format!("{at}/lib/libtorch_cpu.so"),
            ]
        );
        assert_eq!(
            p.lazy,
            [
                format!("{at}/lib/libtorch_cuda.so"),
                format!("{at}/lib/libc10.so")
            ]
        );
    }

    /// The start-up of torch 2.11 on a GPU node (import, CUDA init, a GEMM, a cuDNN
    /// convolution, an NCCL all-reduce), recorded by `probe --record-startup`
    /// (benches/results/startup-h100-2026-12-06): the big libraries it maps in part stay
    /// lazy, everything else it read is fetched, in the order it was read.
    #[test]
    fn a_gpu_start_up_fetches_what_it_reads_and_leaves_the_large_libraries_lazy() {
        let at = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/startup-h100-torch2.11.json");
        let r = StartupRecord::read(&at).unwrap();
        assert_eq!(r.torch, "2.11.0+cu130");
        assert_eq!(r.steps.len(), 5, "{:?}", r.steps);
        let p = plan(&r, "/opt/gpubake/venv/lib/python3.12/site-packages");
        let site = "opt/gpubake/venv/lib/python3.12/site-packages";
        assert_eq!(p.fetched.len() + p.lazy.len(), r.files.len());
        assert_eq!(p.fetched[0], format!("{site}/torch/__init__.py"));
        for lib in [
            "torch/lib/libtorch_cuda.so",
            "torch/lib/libtorch_cpu.so",
            "nvidia/cu13/lib/libcublasLt.so.13",
            "nvidia/nccl/lib/libnccl.so.2",
        ] {
            assert!(
                p.lazy.contains(&format!("{site}/{lib}")),
                "{lib} is fetched"
            );
        }
        let size = |paths: &[String]| -> u64 {
            paths
                .iter()
                .map(|p| {
                    let rel = p.strip_prefix(&format!("{site}/")).unwrap();
                    r.files
                        .iter()
                        .find(|f| f.path == format!("site-packages/{rel}"))
                        .unwrap()
                        .size
                })
                .sum()
        };
        // What is fetched before the container starts is a small part of what it touches.
        let (fetched, lazy) = (size(&p.fetched), size(&p.lazy));
        assert!(
            fetched < 64 << 20 && lazy > 3 << 30,
            "{fetched} fetched, {lazy} lazy"
        );
    }

    #[test]
    fn a_file_the_stack_lacks_is_named_with_its_field() {
        let r = record(&[
            ("site-packages/torch/__init__.py", 10, 10),
            ("site-packages/vllm/__init__.py", 10, 10),
            ("site-packages/vllm/x.py", 10, 10),
        ]);
        let held: BTreeMap<String, ()> = [("sp/torch/__init__.py".to_string(), ())].into();
        let e = check_held(&r, Path::new("startup.json"), "sp", &held)
            .unwrap_err()
            .to_string();
        assert!(e.contains("startup.json"), "{e}");
        assert!(e.contains("files[1].path"), "{e}");
        assert!(e.contains("site-packages/vllm/__init__.py"), "{e}");
        assert!(e.contains("1 more"), "{e}");
        let held: BTreeMap<String, ()> = r
            .files
            .iter()
            .map(|f| (image_path(&f.path, "/sp/"), ()))
            .collect();
        check_held(&r, Path::new("startup.json"), "/sp/", &held).unwrap();
    }
}
