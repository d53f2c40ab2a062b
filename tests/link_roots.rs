//! certify's link closure judges what a job loads. The PyPI wheels torch >= 2.9 pins ship
//! plugins (NVSHMEM's transports and bootstraps, cuFile's RDMA library) that need MPI, PMIx,
//! UCX, libfabric and rdma-core, which a training image rarely has; nothing needs those plugins
//! through DT_NEEDED, their loaders open them with dlopen when a setting selects them.
//!
//! The image here is made of gcc-built stand-ins with the names (DT_SONAME, DT_NEEDED,
//! DT_RPATH/DT_RUNPATH) that tests/fixtures/plugins-needed.txt records from the real wheels,
//! laid out where pip puts them, beside the host's glibc and libstdc++; a name the record says
//! lddtree did not find is linked against and never shipped. One image per rule class:
//! a program or an extension module (also a plain `.so` defining PyInit_<name>) that reaches
//! a missing library fails; a plugin nothing reaches does not, unless the config's Env selects
//! it (the failure names the variable); a plugin a root needs through DT_NEEDED is judged as
//! that root's library; a shared object nothing reaches and no known loader opens is a warning.

mod common;

use common::{gpubake, stdout};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const SITE: &str = "/usr/local/lib/python3.11/dist-packages";
const HOST_LIBS: &str = "/lib/x86_64-linux-gnu";

/// One file of the record: its soname, its DT_NEEDED in order, its search paths, and the names
/// lddtree did not find.
#[derive(Debug, Default)]
struct Recorded {
    soname: Option<String>,
    needed: Vec<String>,
    rpath: Option<String>,
    runpath: Option<String>,
    not_found: Vec<String>,
}

/// tests/fixtures/plugins-needed.txt by the file's path in the wheel.
fn record() -> BTreeMap<String, Recorded> {
    let text =
        std::fs::read_to_string(common::root().join("tests/fixtures/plugins-needed.txt")).unwrap();
    let mut files: BTreeMap<String, Recorded> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("file"), Some(path), None) => {
                current = path.to_string();
                files.entry(current.clone()).or_default();
            }
            (Some("readelf"), Some(tag), Some(value)) => {
                let f = files.get_mut(&current).expect("a file line first");
                let value = value.to_string();
                match tag {
                    "NEEDED" => f.needed.push(value),
                    "SONAME" => f.soname = Some(value),
                    "RPATH" => f.rpath = Some(value),
                    "RUNPATH" => f.runpath = Some(value),
                    _ => panic!("unknown tag in {line}"),
                }
            }
            (Some("lddtree"), Some(name), Some("=>")) => {
                if line.ends_with("=> None") {
                    let f = files.get_mut(&current).expect("a file line first");
                    f.not_found.push(name.to_string());
                }
            }
            (None, ..) => {}
            _ => panic!("unreadable line: {line}"),
        }
    }
    files
}

struct Gcc<'a> {
    ctx: &'a Path,
}

impl Gcc<'_> {
    fn run(&self, args: &[String]) {
        common::gcc(self.ctx, args);
    }

    /// A shared object at `out` named `soname`, needing `needed` in that order: a name found
    /// in `dirs` links against that file, any other against the host's copy.
    fn shared(&self, out: &Path, soname: &str, needed: &[String], dirs: &[&Path], extra: &[&str]) {
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let src = common::root().join("tests/fixtures/links/plugin.c");
        let mut args: Vec<String> = ["-shared", "-fPIC", "-Wl,--no-as-needed", "-o"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(out.display().to_string());
        args.push(format!("-Wl,-soname,{soname}"));
        args.push(src.display().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        for name in needed {
            let dir = dirs
                .iter()
                .find(|d| d.join(name).exists())
                .map(|d| d.to_path_buf())
                .unwrap_or_else(|| PathBuf::from(HOST_LIBS));
            // A full path keeps the name as DT_NEEDED only with -l:, so search that directory.
            args.push(format!("-L{}", dir.display()));
            args.push(format!("-l:{name}"));
        }
        self.run(&args);
    }
}

fn at(fs: &Path, path: &str) -> PathBuf {
    let p = fs.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    p
}

/// The files every image here has: the host's C and C++ runtime, the wheels' libraries and
/// plugins as recorded, an extension module that needs NVSHMEM's and cuFile's libraries (as
/// torch's do), and a shared object nothing reaches that needs a library nothing ships.
fn base(ctx: &Path) {
    let fs = ctx.join("rootfs");
    let gcc = Gcc { ctx };
    for lib in [
        "libc.so.6",
        "libm.so.6",
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libpthread.so.0",
        "libdl.so.2",
        "librt.so.1",
        "ld-linux-x86-64.so.2",
    ] {
        std::fs::copy(
            Path::new(HOST_LIBS).join(lib),
            at(&fs, &format!("{HOST_LIBS}/{lib}")),
        )
        .unwrap();
    }
    std::fs::create_dir_all(fs.join("usr/lib/x86_64-linux-gnu")).unwrap();
    std::os::unix::fs::symlink(
        format!("{HOST_LIBS}/ld-linux-x86-64.so.2"),
        at(&fs, "/lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();

    // Names nothing in the image provides: linked against, never shipped.
    let link_only = ctx.join("link-only");
    std::fs::create_dir_all(&link_only).unwrap();
    let record = record();
    let mut missing: Vec<&str> = record
        .values()
        .flat_map(|r| r.not_found.iter().map(String::as_str))
        .collect();
    missing.push("libgone.so.1");
    missing.sort();
    missing.dedup();
    for name in missing {
        gcc.shared(&link_only.join(name), name, &[], &[], &[]);
    }

    // The wheels' files, libraries before the plugins that need them.
    let mut order: Vec<(&String, &Recorded)> = record.iter().collect();
    order.sort_by_key(|(path, r)| (r.needed.iter().any(|n| n.starts_with("libcufile")), *path));
    for (path, r) in order {
        let out = at(&fs, &format!("{SITE}/{path}"));
        let dir = out.parent().unwrap().to_path_buf();
        let mut extra = Vec::new();
        let search;
        if let Some(rpath) = &r.rpath {
            search = format!("-Wl,--disable-new-dtags,-rpath,{rpath}");
            extra.push(search.as_str());
        } else if let Some(runpath) = &r.runpath {
            search = format!("-Wl,--enable-new-dtags,-rpath,{runpath}");
            extra.push(search.as_str());
        }
        let soname = r.soname.clone().unwrap();
        gcc.shared(&out, &soname, &r.needed, &[&dir, &link_only], &extra);
    }

    // An extension module that needs the wheels' libraries, as torch's do.
    let nvshmem = fs.join(format!("{SITE}/nvidia/nvshmem/lib").trim_start_matches('/'));
    let cufile = fs.join(format!("{SITE}/nvidia/cufile/lib").trim_start_matches('/'));
    gcc.shared(
        &at(&fs, &format!("{SITE}/torch/_C.cpython-311-x86_64-linux-gnu.so")),
        "_C.cpython-311-x86_64-linux-gnu.so",
        &["libnvshmem_host.so.3".into(), "libcufile.so.0".into()],
        &[&nvshmem, &cufile],
        &["-Wl,--enable-new-dtags,-rpath,$ORIGIN/../nvidia/nvshmem/lib:$ORIGIN/../nvidia/cufile/lib"],
    );
    // A program, which needs nothing missing.
    gcc.run(&[
        "-o".into(),
        at(&fs, "/usr/local/bin/train").display().to_string(),
        common::root()
            .join("tests/fixtures/links/main.c")
            .display()
            .to_string(),
    ]);
    // A plain `.so` without PyInit_<name>: no extension module, and no known plugin.
    gcc.shared(
        &at(&fs, &format!("{SITE}/mystery/libmystery.so")),
        "libmystery.so",
        &["libgone.so.1".into()],
        &[&link_only],
        &[],
    );
}

/// The image of `base` with `extra` (Dockerfile lines after the base's), built into the
/// engine; its tag. None where docker or gcc is missing.
fn image(name: &str, extra: &str, files: impl Fn(&Path)) -> Option<String> {
    if !common::have("docker", "info")
        || !common::have("gcc", "--version")
        || !Path::new(HOST_LIBS).join("libc.so.6").exists()
    {
        return None;
    }
    let ctx = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("link-roots-{name}"));
    let _ = std::fs::remove_dir_all(&ctx);
    std::fs::create_dir_all(&ctx).unwrap();
    base(&ctx);
    files(&ctx);
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM scratch\nCOPY rootfs/ /\n{extra}\n"),
    )
    .unwrap();
    std::fs::write(ctx.join(".dockerignore"), "link-only\n").unwrap();
    let tag = format!("gpubake-link-roots-{name}:test");
    let out = Command::new("docker")
        .args(["build", "-q", "-t", &tag])
        .arg(&ctx)
        .output()
        .expect("docker runs");
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(tag)
}

/// certify's `link closure` line for `tag`, and the whole output.
fn link_closure(tag: &str) -> (String, String) {
    let out = gpubake(&["certify", &format!("docker-daemon:{tag}"), "--gpus", "none"]);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.contains("link closure"))
        .unwrap_or_else(|| panic!("no link closure check:\n{text}"))
        .to_string();
    let _ = Command::new("docker").args(["rmi", tag]).output();
    (line, text)
}

/// The plugins of the wheels torch 2.9.1 pins cannot load in an image without MPI, UCX,
/// libfabric or rdma-core, and nothing in it selects them: the image does not fail; the
/// report names each, with what would select it; the shared object no known loader opens is a
/// warning.
#[test]
fn plugins_nothing_selects_do_not_fail_an_image() {
    let Some(tag) = image("plain", "", |_| {}) else {
        return;
    };
    let (line, text) = link_closure(&tag);
    assert!(line.contains("WARN"), "{line}\n{text}");
    for want in [
        "nvshmem_transport_ucx.so.3 (needs libucs.so.0, libucp.so.0; selected by NVSHMEM_REMOTE_TRANSPORT=ucx)",
        "nvshmem_transport_ibgda.so.3 (needs libmlx5.so.1; selected by NVSHMEM_IB_ENABLE_IBGDA=1)",
        "nvshmem_bootstrap_pmix.so.3 (needs libpmix.so.2; selected by NVSHMEM_BOOTSTRAP=PMI and NVSHMEM_BOOTSTRAP_PMI=PMIX)",
        "libcufile_rdma.so.1 (needs libmlx5.so.1, librdmacm.so.1, libibverbs.so.1",
        "mystery/libmystery.so needs libgone.so.1",
    ] {
        assert!(line.contains(want), "no {want:?} in {line}");
    }
}

/// The same image with NVSHMEM's UCX transport selected in the config's Env fails, naming the
/// variable and the libraries the plugin lacks.
#[test]
fn a_plugin_the_image_selects_fails_it() {
    let Some(tag) = image("ucx", "ENV NVSHMEM_REMOTE_TRANSPORT=ucx", |_| {}) else {
        return;
    };
    let (line, text) = link_closure(&tag);
    assert!(line.contains("FAIL"), "{line}\n{text}");
    assert!(
        line.contains("nvshmem_transport_ucx.so.3 needs libucs.so.0, libucp.so.0 (not found), and the image selects it: NVSHMEM_REMOTE_TRANSPORT=ucx"),
        "{line}"
    );
    assert!(
        !line.contains("nvshmem_transport_libfabric.so.3 needs"),
        "{line}"
    );
}

/// A program that needs a library nothing ships fails the image.
#[test]
fn a_program_that_needs_a_missing_library_fails() {
    let Some(tag) = image("program", "", |ctx| {
        let gcc = Gcc { ctx };
        let fs = ctx.join("rootfs");
        gcc.run(&[
            "-o".into(),
            at(&fs, "/usr/local/bin/needs-gone").display().to_string(),
            common::root()
                .join("tests/fixtures/links/main.c")
                .display()
                .to_string(),
            format!("-L{}", ctx.join("link-only").display()),
            "-Wl,--no-as-needed".into(),
            "-l:libgone.so.1".into(),
        ]);
    }) else {
        return;
    };
    let (line, text) = link_closure(&tag);
    assert!(line.contains("FAIL"), "{line}\n{text}");
    assert!(
        line.contains("/usr/local/bin/needs-gone needs libgone.so.1 (not found)"),
        "{line}"
    );
}

/// Extension modules: one that needs a plugin through DT_NEEDED (libfabric's transport) is
/// judged with that plugin's needs, and a plain `.so` defining PyInit_<name> is one too.
#[test]
fn an_extension_module_that_reaches_a_missing_library_fails() {
    let Some(tag) = image("extension", "", |ctx| {
        let gcc = Gcc { ctx };
        let fs = ctx.join("rootfs");
        let nvshmem = fs.join(format!("{SITE}/nvidia/nvshmem/lib").trim_start_matches('/'));
        gcc.shared(
            &at(
                &fs,
                &format!("{SITE}/fabric_user.cpython-311-x86_64-linux-gnu.so"),
            ),
            "fabric_user.cpython-311-x86_64-linux-gnu.so",
            &["nvshmem_transport_libfabric.so.3".into()],
            &[&nvshmem],
            &["-Wl,--enable-new-dtags,-rpath,$ORIGIN/nvidia/nvshmem/lib"],
        );
        gcc.shared(
            &at(&fs, &format!("{SITE}/gone_user.so")),
            "gone_user.so",
            &["libgone.so.1".into()],
            &[&ctx.join("link-only")],
            &["-DPYINIT=PyInit_gone_user"],
        );
    }) else {
        return;
    };
    let (line, text) = link_closure(&tag);
    assert!(line.contains("FAIL"), "{line}\n{text}");
    assert!(
        line.contains(&format!(
            "{SITE}/fabric_user.cpython-311-x86_64-linux-gnu.so needs libfabric.so.1 (not found)"
        )),
        "{line}"
    );
    assert!(
        line.contains(&format!(
            "{SITE}/gone_user.so needs libgone.so.1 (not found)"
        )),
        "{line}"
    );
    // The plugin itself is reached now: no longer among those that cannot load.
    assert!(
        !line.contains("nvshmem_transport_libfabric.so.3 (needs"),
        "{line}"
    );
}
