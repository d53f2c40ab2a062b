//! Real wheels from PyPI for the installer tests: pinned by version and sha256, downloaded
//! once with pip into the target directory and checked on every use; plus a zip rewriter for
//! making damaged copies of them.

use sha2::{Digest as _, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// A wheel pinned by exact version, file name and sha256.
#[derive(Clone, Copy, Debug)]
pub struct Pin {
    /// `name==version` as pip takes it.
    pub requirement: &'static str,
    /// The wheel's file name on PyPI.
    pub file: &'static str,
    /// Its sha256 in hex.
    pub sha256: &'static str,
}

/// `.data/scripts` with `#!python` shebangs, and a console script.
pub const DOCUTILS: Pin = Pin {
    requirement: "docutils==0.20.1",
    file: "docutils-0.20.1-py3-none-any.whl",
    sha256: "96f387a2c5562db4476f09f13bbab2192e764cac08ebbf3a34a95d9b1e4a59d6",
};
/// `.data/headers` and `.data/data`.
pub const PYBIND11_GLOBAL: Pin = Pin {
    requirement: "pybind11-global==2.13.6",
    file: "pybind11_global-2.13.6-py3-none-any.whl",
    sha256: "aa5142ebf5a1bdaf8945997f62cc2f2e883ded4f9aa48b4925fc2646ea4bea6d",
};
/// A console script from entry_points.txt, and an executable file in the package.
pub const TQDM: Pin = Pin {
    requirement: "tqdm==4.67.1",
    file: "tqdm-4.67.1-py3-none-any.whl",
    sha256: "26445eca388f82e72884e0d580d5464cd801a3ea01e63e5601bdff9ba6a48de2",
};
/// Root-Is-Purelib: false, an extension module, directory entries in the zip.
pub const MARKUPSAFE: Pin = Pin {
    requirement: "markupsafe==3.0.2",
    file: "MarkupSafe-3.0.2-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    sha256: "e17c96c14e19278594aa4841ec148115f9c7615a47382ecb6b82bd8fea3ab0c8",
};
/// The three below share `nvidia/__init__.py`.
pub const NVTX: Pin = Pin {
    requirement: "nvidia-nvtx-cu12==12.8.90",
    file: "nvidia_nvtx_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "5b17e2001cc0d751a5bc2c6ec6d26ad95913324a4adb86788c944f8ce9ba441f",
};
/// See [`NVTX`].
pub const CUDA_RUNTIME: Pin = Pin {
    requirement: "nvidia-cuda-runtime-cu12==12.8.90",
    file: "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90",
};
/// See [`NVTX`].
pub const CUFILE: Pin = Pin {
    requirement: "nvidia-cufile-cu12==1.13.1.3",
    file: "nvidia_cufile_cu12-1.13.1.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "1d069003be650e131b21c932ec3d8969c1715379251f8d23a1860554b1cb24fc",
};

/// The download cache, kept across runs and `cargo test` invocations.
pub fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is inside the target directory")
        .join("test-wheels")
}

fn sha256_file(path: &Path) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Some(hex::encode(hasher.finalize()))
}

/// The pinned wheel, from the cache or downloaded by pip for a manylinux x86_64 CPython 3.12
/// target; panics unless its sha256 is the pinned one.
pub fn get(pin: Pin) -> PathBuf {
    // One download at a time: parallel tests ask for the same wheels.
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = cache_dir();
    let path = dir.join(pin.file);
    if sha256_file(&path).as_deref() == Some(pin.sha256) {
        return path;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let staging = tempfile::tempdir_in(&dir).unwrap();
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "--implementation",
            "cp",
            "-d",
        ])
        .arg(staging.path())
        .arg(pin.requirement)
        .output()
        .expect("python3 -m pip runs");
    assert!(
        out.status.success(),
        "pip download {} failed:\n{}",
        pin.requirement,
        String::from_utf8_lossy(&out.stderr)
    );
    let got = staging.path().join(pin.file);
    let sha = sha256_file(&got)
        .unwrap_or_else(|| panic!("pip did not download {} for {}", pin.file, pin.requirement));
    assert_eq!(
        sha, pin.sha256,
        "{} downloaded with another sha256 than the pinned one",
        pin.file
    );
    std::fs::rename(&got, &path).unwrap();
    path
}

/// One member of a zip, for [`rewrite`].
#[derive(Clone, Debug)]
pub struct Member {
    /// Its name in the archive.
    pub name: String,
    /// Its content (empty for directories).
    pub bytes: Vec<u8>,
    /// Its unix permission bits.
    pub mode: u32,
}

/// Reads every member of a zip.
pub fn members(path: &Path) -> Vec<Member> {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    (0..zip.len())
        .map(|i| {
            let mut f = zip.by_index(i).unwrap();
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes).unwrap();
            Member {
                name: f.name().unwrap().into_owned(),
                mode: f.unix_mode().unwrap_or(0o644) & 0o777,
                bytes,
            }
        })
        .collect()
}

/// Writes `members` as a zip at `dst`, in order, deflated.
pub fn write_zip(dst: &Path, members: &[Member]) {
    let mut w = zip::ZipWriter::new(std::fs::File::create(dst).unwrap());
    for m in members {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(m.mode);
        if m.name.ends_with('/') {
            w.add_directory(m.name.trim_end_matches('/'), options)
                .unwrap();
        } else {
            w.start_file(m.name.as_str(), options).unwrap();
            w.write_all(&m.bytes).unwrap();
        }
    }
    w.finish().unwrap();
}

/// A copy of the wheel at `src` in `dir`, under its own file name, with `edit` applied to
/// its members.
pub fn rewrite(src: &Path, dir: &Path, edit: impl FnOnce(&mut Vec<Member>)) -> PathBuf {
    let mut all = members(src);
    edit(&mut all);
    let dst = dir.join(src.file_name().unwrap());
    write_zip(&dst, &all);
    dst
}

/// The RECORD line for a file with these bytes.
pub fn record_line(name: &str, bytes: &[u8]) -> String {
    use base64::Engine as _;
    let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes));
    format!("{name},sha256={hash},{}", bytes.len())
}

/// The member named `name`.
pub fn member<'m>(members: &'m mut [Member], name: &str) -> &'m mut Member {
    members
        .iter_mut()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no member {name}"))
}

/// Replaces RECORD's line for `name` with `line` (None drops it).
pub fn edit_record(members: &mut [Member], record: &str, name: &str, line: Option<String>) {
    let record = member(members, record);
    let text = String::from_utf8(record.bytes.clone()).unwrap();
    let prefix = format!("{name},");
    assert!(
        text.lines().any(|l| l.starts_with(&prefix)),
        "RECORD has no line for {name}"
    );
    let mut out = String::new();
    for l in text.lines() {
        if l.starts_with(&prefix) {
            if let Some(line) = &line {
                out.push_str(line);
                out.push('\n');
            }
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    record.bytes = out.into_bytes();
}
