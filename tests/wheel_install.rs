//! The native wheel installer against pypa `installer` on real PyPI wheels: the same scheme,
//! interpreter and INSTALLER must give the same tree, file for file; and damaged wheels are
//! refused, naming the wheel and the member.

mod common;

use common::wheels::{self, Member, Pin};
use gpubake::image::Compression;
use gpubake::image::layer::{LayerSpec, build_layer};
use gpubake::image::layout::{Layout, digest_of};
use gpubake::wheel::install::{Installed, Scheme, install};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::process::Command;

const PREFIX: &str = "/opt/gpubake/venv";
const PYTHON: &str = "3.12";

/// A file of a tree: its bytes and whether it is executable.
type Tree = BTreeMap<String, (Vec<u8>, bool)>;

/// True when python3 can import pypa `installer` (scripts/test installs it); in CI its absence
/// fails the test instead of skipping it.
fn have_installer() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import installer"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs pypa installer (scripts/test); it must import"
        );
        eprintln!("skipped: python3 cannot import pypa installer (pip install installer)");
    }
    ok
}

/// pypa installer's result for `wheel` under `scheme`, unpacked under `destdir`, with the
/// headers directory made the way pip makes it in a venv: the distribution name appended.
const ORACLE: &str = r#"
import sys
from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.sources import WheelFile
from installer.utils import parse_metadata_file

wheel, destdir, purelib, platlib, scripts, headers, data, interpreter = sys.argv[1:]
with WheelFile.open(wheel) as source:
    source.validate_record()
    name = parse_metadata_file(source.read_dist_info("METADATA"))["Name"]
    scheme = {
        "purelib": purelib,
        "platlib": platlib,
        "scripts": scripts,
        "headers": headers + "/" + name,
        "data": data,
    }
    destination = SchemeDictionaryDestination(
        scheme,
        interpreter=interpreter,
        script_kind="posix",
        bytecode_optimization_levels=(),
        destdir=destdir,
    )
    install(source, destination, {"INSTALLER": b"gpubake\n"})
"#;

fn oracle(wheel: &Path, scheme: &Scheme) -> Tree {
    let dest = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg("-c")
        .arg(ORACLE)
        .arg(wheel)
        .arg(dest.path())
        .args([
            &scheme.purelib,
            &scheme.platlib,
            &scheme.scripts,
            &scheme.headers,
            &scheme.data,
            &scheme.interpreter,
        ])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "installer failed on {}:\n{}",
        wheel.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut tree = Tree::new();
    for item in walkdir::WalkDir::new(dest.path()) {
        let item = item.unwrap();
        assert!(!item.file_type().is_symlink(), "installer wrote a symlink");
        if !item.file_type().is_file() {
            continue;
        }
        use std::os::unix::fs::PermissionsExt;
        let rel = item.path().strip_prefix(dest.path()).unwrap();
        let exec = item.metadata().unwrap().permissions().mode() & 0o111 != 0;
        tree.insert(
            rel.to_string_lossy().into_owned(),
            (std::fs::read(item.path()).unwrap(), exec),
        );
    }
    tree
}

/// gpubake's result: the entries written as a real layer by the layer writer (which checks
/// every member against RECORD), read back from the gzip tar.
fn materialize(installs: &[&Installed]) -> gpubake::Result<Tree> {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::create(dir.path()).unwrap();
    // Identical files from several wheels (the nvidia namespace package) go in once; a caller
    // does the same after comparing `files`.
    let mut seen = BTreeMap::new();
    let mut entries = Vec::new();
    for installed in installs {
        for (entry, file) in installed.entries.iter().zip(&installed.files) {
            assert_eq!(entry.path, file.path, "entries and files are in one order");
            if let Some(sha) = seen.insert(file.path.clone(), file.sha256.clone()) {
                assert_eq!(
                    sha, file.sha256,
                    "two wheels write different bytes at {}",
                    file.path
                );
                continue;
            }
            entries.push(entry.clone());
        }
    }
    let spec = LayerSpec {
        name: "wheels".into(),
        created_by: "test".into(),
        entries,
        prefetch: None,
    };
    let built = build_layer(&layout, &spec, Compression::Gzip, 0, false)?;
    let blob = std::fs::File::open(layout.blob_path(&digest_of(&built.descriptor)?)).unwrap();
    let mut tar = tar::Archive::new(flate2::read::MultiGzDecoder::new(blob));
    let mut tree = Tree::new();
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let header = entry.header();
        if header.entry_type().is_dir() {
            continue;
        }
        assert!(header.entry_type().is_file(), "only files and directories");
        let exec = header.mode().unwrap() & 0o111 != 0;
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        tree.insert(path, (bytes, exec));
    }
    Ok(tree)
}

/// Both trees hold the same paths with the same bytes and executable bits; RECORD files are
/// compared as sets of lines, since their order is not part of the format.
fn assert_same(ours: &Tree, theirs: &Tree) {
    let a: BTreeSet<_> = ours.keys().collect();
    let b: BTreeSet<_> = theirs.keys().collect();
    assert_eq!(
        a.difference(&b).collect::<Vec<_>>(),
        Vec::<&&String>::new(),
        "only gpubake installs these"
    );
    assert_eq!(
        b.difference(&a).collect::<Vec<_>>(),
        Vec::<&&String>::new(),
        "only installer installs these"
    );
    for (path, (bytes, exec)) in ours {
        let (want, want_exec) = &theirs[path];
        assert_eq!(exec, want_exec, "{path}: executable bit differs");
        if path.ends_with(".dist-info/RECORD") {
            let lines = |b: &[u8]| -> BTreeSet<String> {
                String::from_utf8(b.to_vec())
                    .unwrap()
                    .lines()
                    .map(str::to_string)
                    .collect()
            };
            assert_eq!(lines(bytes), lines(want), "{path}: RECORD differs");
        } else {
            assert!(
                bytes == want,
                "{path}: content differs\n gpubake: {:?}\n installer: {:?}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)]),
                String::from_utf8_lossy(&want[..want.len().min(300)])
            );
        }
    }
}

/// `files` names every file of the tree with its sha256, and no host path leaks into bytes
/// gpubake wrote itself.
fn assert_files_and_no_host_paths(installed: &Installed, tree: &Tree, wheel: &Path) {
    for file in &installed.files {
        let (bytes, _) = &tree[&file.path];
        assert_eq!(
            file.sha256.as_deref(),
            Some(hex::encode(Sha256::digest(bytes)).as_str()),
            "{}",
            file.path
        );
    }
    let host = [
        wheel.parent().unwrap().display().to_string(),
        env!("CARGO_MANIFEST_DIR").to_string(),
    ];
    for entry in &installed.entries {
        assert!(!entry.path.starts_with('/'), "{}", entry.path);
        if let gpubake::image::layer::Source::Bytes(bytes) = &entry.source {
            let text = String::from_utf8_lossy(bytes);
            for h in &host {
                assert!(
                    !text.contains(h.as_str()),
                    "{} contains host path {h}",
                    entry.path
                );
            }
        }
    }
}

/// Installs `pin` both ways under `scheme` and compares; returns gpubake's plan and tree.
fn compare(pin: Pin, scheme: &Scheme) -> Option<(Installed, Tree)> {
    if !have_installer() {
        return None;
    }
    let wheel = wheels::get(pin);
    let installed = install(&wheel, scheme, "gpubake").unwrap();
    let ours = materialize(&[&installed]).unwrap();
    assert_same(&ours, &oracle(&wheel, scheme));
    assert_files_and_no_host_paths(&installed, &ours, &wheel);
    Some((installed, ours))
}

fn venv() -> Scheme {
    Scheme::venv(PREFIX, PYTHON)
}

fn site(path: &str) -> String {
    format!("opt/gpubake/venv/lib/python3.12/site-packages/{path}")
}

#[test]
fn docutils_data_scripts_get_the_venv_interpreter() {
    let Some((installed, tree)) = compare(wheels::DOCUTILS, &venv()) else {
        return;
    };
    assert_eq!(
        (installed.name.as_str(), installed.version.as_str()),
        ("docutils", "0.20.1")
    );
    let (script, exec) = &tree["opt/gpubake/venv/bin/rst2html.py"];
    assert!(script.starts_with(b"#!/opt/gpubake/venv/bin/python\n"));
    assert!(exec);
    let (launcher, exec) = &tree["opt/gpubake/venv/bin/docutils"];
    assert!(launcher.starts_with(b"#!/opt/gpubake/venv/bin/python\n"));
    assert!(String::from_utf8_lossy(launcher).contains("from docutils.__main__ import main"));
    assert!(exec);
    assert!(!tree.keys().any(|p| p.ends_with(".pyc")), "no bytecode");
}

#[test]
fn pybind11_headers_and_data_leave_site_packages() {
    let Some((installed, tree)) = compare(wheels::PYBIND11_GLOBAL, &venv()) else {
        return;
    };
    let paths: BTreeSet<_> = installed.files.iter().map(|f| f.path.as_str()).collect();
    assert!(
        paths.contains(
            "opt/gpubake/venv/include/site/python3.12/pybind11_global/pybind11/pybind11.h"
        )
    );
    assert!(paths.contains("opt/gpubake/venv/include/pybind11/pybind11.h"));
    assert!(paths.contains("opt/gpubake/venv/share/cmake/pybind11/pybind11Config.cmake"));
    let record = String::from_utf8(
        tree[&site("pybind11_global-2.13.6.dist-info/RECORD")]
            .0
            .clone(),
    )
    .unwrap();
    assert!(record.contains("\n../../../include/pybind11/pybind11.h,sha256="));
    assert!(record.contains("\npybind11_global-2.13.6.dist-info/RECORD,,\n"));
}

#[test]
fn tqdm_console_script_and_executable_bit() {
    let Some((installed, _)) = compare(wheels::TQDM, &venv()) else {
        return;
    };
    let modes: BTreeMap<_, _> = installed
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e.mode))
        .collect();
    assert_eq!(modes["opt/gpubake/venv/bin/tqdm"], 0o755);
    assert_eq!(modes[site("tqdm/completion.sh").as_str()], 0o755);
    assert_eq!(modes[site("tqdm/cli.py").as_str()], 0o644);
    assert_eq!(
        modes[site("tqdm-4.67.1.dist-info/INSTALLER").as_str()],
        0o644
    );
}

#[test]
fn markupsafe_platlib_root() {
    let Some((installed, _)) = compare(wheels::MARKUPSAFE, &venv()) else {
        return;
    };
    assert_eq!(installed.name, "MarkupSafe");
}

/// Separate purelib and platlib, a spaced and long interpreter (the /bin/sh launcher form),
/// a data directory at the image root.
#[test]
fn unusual_scheme_matches_too() {
    let scheme = Scheme {
        purelib: "/srv/py env/lib/python3.12/site-packages".into(),
        platlib: "/srv/py env/lib64/python3.12/site-packages/".into(),
        scripts: "/usr/local/bin".into(),
        headers: "/usr/include/site/python3.12".into(),
        data: "/".into(),
        interpreter: format!("/srv/py env/{}/bin/python3.12", "long".repeat(30)),
    };
    for pin in [
        wheels::MARKUPSAFE,
        wheels::PYBIND11_GLOBAL,
        wheels::DOCUTILS,
        wheels::TQDM,
    ] {
        if compare(pin, &scheme).is_none() {
            return;
        }
    }
}

/// Three wheels, one layer: the shared `nvidia/__init__.py` goes in once, and the layer holds
/// exactly what installer gives for the three installed one by one.
#[test]
fn nvidia_wheels_share_their_namespace_package() {
    if !have_installer() {
        return;
    }
    let scheme = venv();
    let mut planned = Vec::new();
    let mut expected = Tree::new();
    for pin in [wheels::NVTX, wheels::CUDA_RUNTIME, wheels::CUFILE] {
        let wheel = wheels::get(pin);
        for (path, file) in oracle(&wheel, &scheme) {
            if let Some(other) = expected.insert(path.clone(), file.clone()) {
                assert_eq!(other, file, "installer wrote {path} differently");
            }
        }
        planned.push((install(&wheel, &scheme, "gpubake").unwrap(), wheel));
    }
    let init = site("nvidia/__init__.py");
    let shas: BTreeSet<_> = planned
        .iter()
        .map(|(i, _)| {
            i.files
                .iter()
                .find(|f| f.path == init)
                .expect("every nvidia wheel ships nvidia/__init__.py")
                .sha256
                .clone()
        })
        .collect();
    assert_eq!(shas.len(), 1, "nvidia/__init__.py is the same in all three");
    let all: Vec<&Installed> = planned.iter().map(|(i, _)| i).collect();
    let ours = materialize(&all).unwrap();
    assert_same(&ours, &expected);
    for (installed, wheel) in &planned {
        assert_files_and_no_host_paths(installed, &ours, wheel);
    }
}

// ---- damaged wheels -------------------------------------------------------------------

fn refused(result: gpubake::Result<impl std::fmt::Debug>, wheel: &Path, needles: &[&str]) {
    let err = result.expect_err("the damaged wheel is refused");
    let gpubake::Error::Wheel { wheel: named, .. } = &err else {
        panic!("not a wheel error: {err:?}");
    };
    assert_eq!(named, &wheel.display().to_string());
    let text = err.to_string();
    for needle in needles {
        assert!(text.contains(needle), "`{needle}` not in: {text}");
    }
}

const TQDM_RECORD: &str = "tqdm-4.67.1.dist-info/RECORD";

#[test]
fn tampered_record_hash_fails_the_layer_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = wheels::rewrite(&wheels::get(wheels::TQDM), dir.path(), |m| {
        let cli = wheels::member(m, "tqdm/cli.py").bytes.clone();
        let mut other = cli.clone();
        other[0] ^= 1;
        // Right size, wrong hash: only reading the bytes can tell.
        let line = wheels::record_line("tqdm/cli.py", &other);
        wheels::edit_record(m, TQDM_RECORD, "tqdm/cli.py", Some(line));
    });
    let installed = install(&wheel, &venv(), "gpubake").expect("planning reads no module");
    refused(
        materialize(&[&installed]),
        &wheel,
        &["tqdm/cli.py", "does not match RECORD"],
    );
}

#[test]
fn tampered_script_is_refused_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let name = "docutils-0.20.1.data/scripts/rst2html.py";
    let wheel = wheels::rewrite(&wheels::get(wheels::DOCUTILS), dir.path(), |m| {
        let script = wheels::member(m, name);
        let last = script.bytes.len() - 2;
        script.bytes[last] ^= 1;
    });
    refused(
        install(&wheel, &venv(), "gpubake"),
        &wheel,
        &[name, "does not match RECORD"],
    );
}

#[test]
fn stronger_record_hashes_are_checked_here() {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let dir = tempfile::tempdir().unwrap();
    let good = tempfile::tempdir().unwrap();
    let with_sha512 = |m: &mut Vec<Member>, flip: bool| {
        let mut cli = wheels::member(m, "tqdm/cli.py").bytes.clone();
        if flip {
            cli[0] ^= 1;
        }
        let line = format!(
            "tqdm/cli.py,sha512={},{}",
            b64(&sha2::Sha512::digest(&cli)),
            cli.len()
        );
        wheels::edit_record(m, TQDM_RECORD, "tqdm/cli.py", Some(line));
    };
    let src = wheels::get(wheels::TQDM);
    let ok = wheels::rewrite(&src, good.path(), |m| with_sha512(m, false));
    let installed = install(&ok, &venv(), "gpubake").unwrap();
    let tree = materialize(&[&installed]).unwrap();
    if have_installer() {
        assert_same(&tree, &oracle(&ok, &venv()));
    }
    let bad = wheels::rewrite(&src, dir.path(), |m| with_sha512(m, true));
    refused(
        install(&bad, &venv(), "gpubake"),
        &bad,
        &["tqdm/cli.py", "sha512", "does not match RECORD"],
    );
}

#[test]
fn member_missing_from_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = wheels::rewrite(&wheels::get(wheels::TQDM), dir.path(), |m| {
        wheels::edit_record(m, TQDM_RECORD, "tqdm/cli.py", None);
    });
    refused(
        install(&wheel, &venv(), "gpubake"),
        &wheel,
        &["tqdm/cli.py is not listed in RECORD"],
    );
}

#[test]
fn record_entry_missing_from_wheel_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = wheels::rewrite(&wheels::get(wheels::TQDM), dir.path(), |m| {
        m.retain(|x| x.name != "tqdm/cli.py");
    });
    refused(
        install(&wheel, &venv(), "gpubake"),
        &wheel,
        &["lists `tqdm/cli.py`, which is not in the wheel"],
    );
}

#[test]
fn size_disagreeing_with_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = wheels::rewrite(&wheels::get(wheels::TQDM), dir.path(), |m| {
        wheels::member(m, "tqdm/cli.py").bytes.push(b'\n');
    });
    refused(
        install(&wheel, &venv(), "gpubake"),
        &wheel,
        &["tqdm/cli.py", "RECORD line", "says"],
    );
}

#[test]
fn parent_dir_path_is_refused_even_when_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let evil = "tqdm/../../../../../etc/profile.d/evil.sh";
    let wheel = wheels::rewrite(&wheels::get(wheels::TQDM), dir.path(), |m| {
        let bytes = b"echo owned\n".to_vec();
        let line = wheels::record_line(evil, &bytes);
        let record = wheels::member(m, TQDM_RECORD);
        record
            .bytes
            .extend_from_slice(format!("{line}\n").as_bytes());
        m.push(Member {
            name: evil.into(),
            bytes,
            mode: 0o644,
        });
    });
    refused(install(&wheel, &venv(), "gpubake"), &wheel, &[evil, "`..`"]);
}

#[test]
fn missing_dist_info_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = wheels::rewrite(&wheels::get(wheels::TQDM), dir.path(), |m| {
        m.retain(|x| !x.name.starts_with("tqdm-4.67.1.dist-info/"));
    });
    refused(
        install(&wheel, &venv(), "gpubake"),
        &wheel,
        &["no `.dist-info` directory"],
    );
}

#[test]
fn unknown_data_scheme_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = wheels::rewrite(&wheels::get(wheels::TQDM), dir.path(), |m| {
        let name = "tqdm-4.67.1.data/etc/tqdm.conf";
        let bytes = b"x\n".to_vec();
        let line = wheels::record_line(name, &bytes);
        let record = wheels::member(m, TQDM_RECORD);
        record
            .bytes
            .extend_from_slice(format!("{line}\n").as_bytes());
        m.push(Member {
            name: name.into(),
            bytes,
            mode: 0o644,
        });
    });
    refused(
        install(&wheel, &venv(), "gpubake"),
        &wheel,
        &["`etc` is not a scheme"],
    );
}

#[test]
fn duplicate_members_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // The zip writer refuses duplicate names, so write two distinct ones of equal length and
    // patch the second into the first in the raw archive (headers are not checksummed).
    let wheel = wheels::rewrite(&wheels::get(wheels::TQDM), dir.path(), |m| {
        for name in ["tqdm/dupe_A.py", "tqdm/dupe_B.py"] {
            m.push(Member {
                name: name.into(),
                bytes: b"pass\n".to_vec(),
                mode: 0o644,
            });
        }
    });
    let raw = std::fs::read(&wheel).unwrap();
    let (from, to) = (b"tqdm/dupe_B.py", b"tqdm/dupe_A.py");
    let mut patched = raw.clone();
    let mut hits = 0;
    for i in 0..raw.len().saturating_sub(from.len()) {
        if &raw[i..i + from.len()] == from {
            patched[i..i + to.len()].copy_from_slice(to);
            hits += 1;
        }
    }
    assert_eq!(hits, 2, "the name is in the local and the central header");
    std::fs::write(&wheel, patched).unwrap();
    refused(
        install(&wheel, &venv(), "gpubake"),
        &wheel,
        &["more than once"],
    );
}

#[test]
fn garbage_is_not_a_wheel() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("x-1.0-py3-none-any.whl");
    std::fs::write(&wheel, b"PK\x03\x04 not really").unwrap();
    refused(
        install(&wheel, &venv(), "gpubake"),
        &wheel,
        &["not a readable zip archive"],
    );
}

/// Bytecode in a wheel's `__pycache__` is skipped as installer skips it (it would be stale or
/// planted), but it must still be listed in RECORD like every other member.
#[test]
fn pycache_members_are_checked_but_not_installed() {
    let dir = tempfile::tempdir().unwrap();
    let unlisted = tempfile::tempdir().unwrap();
    let pyc = "tqdm/__pycache__/cli.cpython-312.pyc";
    let add = |m: &mut Vec<Member>, listed: bool| {
        let bytes = b"\xcb\x0d\x0d\x0a not really bytecode".to_vec();
        if listed {
            let line = wheels::record_line(pyc, &bytes);
            let record = wheels::member(m, TQDM_RECORD);
            record
                .bytes
                .extend_from_slice(format!("{line}\n").as_bytes());
        }
        m.push(Member {
            name: pyc.into(),
            bytes,
            mode: 0o644,
        });
    };
    let src = wheels::get(wheels::TQDM);
    let wheel = wheels::rewrite(&src, dir.path(), |m| add(m, true));
    let installed = install(&wheel, &venv(), "gpubake").unwrap();
    assert!(
        !installed
            .files
            .iter()
            .any(|f| f.path.contains("__pycache__"))
    );
    if have_installer() {
        let ours = materialize(&[&installed]).unwrap();
        assert_same(&ours, &oracle(&wheel, &venv()));
    }
    let bad = wheels::rewrite(&src, unlisted.path(), |m| add(m, false));
    refused(
        install(&bad, &venv(), "gpubake"),
        &bad,
        &[pyc, "not listed in RECORD"],
    );
}
