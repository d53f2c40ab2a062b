//! Stand-ins for the NVIDIA driver's libraries, built with gcc, for the probe's tests on a
//! machine without a GPU.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds a shared object from the C `source` with gcc at `dir/path`, its DT_SONAME
/// `soname`, linked against `link` (paths relative to `dir`; kept as DT_NEEDED). None, with the
/// reason printed, when gcc cannot build it.
pub fn gcc_library(
    dir: &Path,
    path: &str,
    soname: &str,
    source: &str,
    link: &[&str],
) -> Option<PathBuf> {
    let file = dir.join(path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let c = dir.join(format!("{soname}.c"));
    std::fs::write(&c, source).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-Wl,--no-as-needed", "-o"])
        .arg(&file)
        .arg(format!("-Wl,-soname,{soname}"))
        .arg(&c)
        .args(link)
        .current_dir(dir)
        .output();
    match out {
        Ok(out) if out.status.success() => Some(file),
        Ok(out) => {
            eprintln!(
                "skipped: gcc cannot build {path}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("skipped: no gcc to build {path}: {e}");
            None
        }
    }
}

/// A stand-in `libnvidia-ml.so.1` built with gcc: NVML that initialises, reports two GPUs,
/// and cannot open GPU 1 (as for a GPU fallen off the bus). With `needs`, it is linked against
/// a library that is then deleted, so loading it fails as in an image that lacks a
/// dependency. None when gcc cannot build it.
pub fn fake_nvml(dir: &Path, needs: Option<&str>) -> Option<PathBuf> {
    let source = r#"
        #include <stdio.h>
        int nvmlInit_v2(void) { return 0; }
        int nvmlShutdown(void) { return 0; }
        int nvmlSystemGetDriverVersion(char *v, unsigned n) { snprintf(v, n, "580.95.05"); return 0; }
        int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
        int nvmlDeviceGetCount_v2(unsigned *c) { *c = 2; return 0; }
        /* 15 is NVML_ERROR_GPU_IS_LOST. */
        int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
            if (i == 1) return 15;
            *d = (void *)0x1000;
            return 0;
        }
    "#;
    let dep = needs.map(|dep| {
        gcc_library(dir, dep, dep, "int gpubake_dep(void) { return 0; }\n", &[])
            .map(|_| format!("./{dep}"))
    });
    let link: Vec<&str> = match &dep {
        Some(Some(dep)) => vec![dep.as_str()],
        Some(None) => return None,
        None => Vec::new(),
    };
    let lib = gcc_library(
        dir,
        "lib/libnvidia-ml.so.1",
        "libnvidia-ml.so.1",
        source,
        &link,
    )?;
    if let Some(dep) = needs {
        std::fs::remove_file(dir.join(dep)).unwrap();
    }
    Some(lib.parent().unwrap().to_path_buf())
}
