//! `gpubake inspect --libraries` and certify's link-closure check on an image gpubake did not
//! build: `docker build` over the Debian base adds gcc-built libraries in two copies
//! (/opt/wheel/lib with RUNPATH $ORIGIN, /opt/cuda/lib on the config's LD_LIBRARY_PATH), the
//! real nvidia-cuda-runtime-cu12 wheel's libcudart with a second copy in /usr/local/cuda/lib64
//! (an ld.so.conf entry, ldconfig run), a compat libcuda.so.1 on LD_LIBRARY_PATH and an
//! extension module that needs a library nothing ships. The binding map is compared with what
//! `ldd` prints inside the container and with what Debian's lddtree (pax-utils) prints over
//! the unpacked root.

mod common;

use common::{assert_exit, gpubake, stdout};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const SITE: &str = "/usr/local/lib/python3.11/dist-packages";
const LD_LIBRARY_PATH: &str = "/opt/cuda/lib:/usr/local/cuda/compat";

/// The files of the image above, under `ctx/rootfs`.
fn rootfs(ctx: &Path) {
    let src = common::root().join("tests/fixtures/links");
    let src = src.to_str().unwrap();
    let fs = ctx.join("rootfs");
    let at = |p: &str| {
        let path = fs.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        path.to_str().unwrap().to_string()
    };
    let lib = |out: &str, soname: &str, c: &str, extra: &[&str]| {
        let mut args = vec!["-shared", "-fPIC", "-Wl,--no-as-needed", "-o", out];
        let so = format!("-Wl,-soname,{soname}");
        let c = format!("{src}/{c}");
        args.push(&so);
        args.push(&c);
        args.extend(extra);
        common::gcc(ctx, &args);
    };
    let wheel = at("/opt/wheel/lib/x");
    let wheel = Path::new(&wheel)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let cuda = at("/opt/cuda/lib/x");
    let cuda = Path::new(&cuda)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    for dir in [&wheel, &cuda] {
        lib(&format!("{dir}/libbar.so.1"), "libbar.so.1", "bar.c", &[]);
    }
    // The wheel's copy finds its sibling through RUNPATH $ORIGIN, as the nvidia wheels do.
    let l = format!("-L{wheel}");
    lib(
        &format!("{wheel}/libfoo.so.1"),
        "libfoo.so.1",
        "foo.c",
        &[
            &l,
            "-l:libbar.so.1",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
        ],
    );
    let l = format!("-L{cuda}");
    lib(
        &format!("{cuda}/libfoo.so.1"),
        "libfoo.so.1",
        "foo.c",
        &[&l, "-l:libbar.so.1"],
    );
    let app = format!("{src}/app.c");
    let l = format!("-L{wheel}");
    // DT_RPATH beats LD_LIBRARY_PATH: libfoo comes from the wheel, but its DT_RUNPATH comes
    // after LD_LIBRARY_PATH, so its libbar comes from /opt/cuda/lib.
    common::gcc(
        ctx,
        &[
            "-o",
            &at("/usr/local/bin/app-rpath"),
            &app,
            &l,
            "-l:libfoo.so.1",
            "-Wl,--disable-new-dtags,-rpath,/opt/wheel/lib",
        ],
    );
    common::gcc(
        ctx,
        &[
            "-o",
            &at("/usr/local/bin/app-plain"),
            &app,
            &l,
            "-l:libfoo.so.1",
        ],
    );

    // The real wheel, unpacked where pip puts it, and a second libcudart under
    // /usr/local/cuda/lib64 that ld.so.conf names.
    let whl = common::wheels::get(common::wheels::CUDA_RUNTIME);
    let site = at(&format!("{SITE}/x"));
    let site = Path::new(&site)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let out = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&whl)
        .arg(&site)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cudart = format!("{site}/nvidia/cuda_runtime/lib/libcudart.so.12");
    std::fs::copy(&cudart, at("/usr/local/cuda/lib64/libcudart.so.12")).unwrap();
    std::fs::write(at("/etc/ld.so.conf.d/cuda.conf"), "/usr/local/cuda/lib64\n").unwrap();
    lib(
        &at("/usr/local/cuda/compat/libcuda.so.1"),
        "libcuda.so.1",
        "libcuda.c",
        &[],
    );
    let tmp = ctx.join("link-only");
    std::fs::create_dir_all(&tmp).unwrap();
    lib(
        tmp.join("libgone.so.1").to_str().unwrap(),
        "libgone.so.1",
        "gone.c",
        &[],
    );
    let lgone = format!("-L{}", tmp.display());
    let lcudart = format!("-L{site}/nvidia/cuda_runtime/lib");
    lib(
        &format!("{site}/cudauser.so"),
        "cudauser.so",
        "cudauser.c",
        &[
            &lcudart,
            "-l:libcudart.so.12",
            &lgone,
            "-l:libgone.so.1",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/nvidia/cuda_runtime/lib",
        ],
    );
}

/// The test image in the engine, built once for the tests of this file: its tag and the
/// build context (whose `rootfs/` holds the image's added files).
fn image() -> Option<(String, PathBuf)> {
    static IMAGE: std::sync::OnceLock<Option<(String, PathBuf)>> = std::sync::OnceLock::new();
    IMAGE.get_or_init(build_image).clone()
}

fn build_image() -> Option<(String, PathBuf)> {
    if !common::tools() || !common::have("docker", "info") || !common::have("gcc", "--version") {
        return None;
    }
    let base = common::debian_base()?;
    let ctx = Path::new(env!("CARGO_TARGET_TMPDIR")).join("links-image");
    let _ = std::fs::remove_dir_all(&ctx);
    std::fs::create_dir_all(&ctx).unwrap();
    let from = "gpubake-links-base:test";
    common::stack::base_into_engine(&base, from);
    rootfs(&ctx);
    std::fs::write(
        ctx.join("Dockerfile"),
        format!(
            "FROM {from}\nCOPY rootfs/ /\nRUN ldconfig\nENV LD_LIBRARY_PATH={LD_LIBRARY_PATH}\n"
        ),
    )
    .unwrap();
    std::fs::write(ctx.join(".dockerignore"), "link-only\n").unwrap();
    // One tag, rebuilt by each run: the engine keeps at most one such image.
    let tag = "gpubake-links-test:latest".to_string();
    let out = Command::new("docker")
        .args(["build", "-q", "-t", &tag])
        .arg(&ctx)
        .output()
        .expect("docker runs");
    let _ = Command::new("docker").args(["rmi", from]).output();
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some((tag, ctx))
}

/// The files whose closures the oracles are asked about.
fn files() -> Vec<String> {
    [
        "/usr/local/bin/app-rpath",
        "/usr/local/bin/app-plain",
        "/opt/wheel/lib/libfoo.so.1",
        "/opt/cuda/lib/libfoo.so.1",
        "/usr/local/cuda/compat/libcuda.so.1",
        "/usr/local/cuda/lib64/libcudart.so.12",
        "/usr/bin/python3.11",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        format!("{SITE}/cudauser.so"),
        format!("{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12"),
    ])
    .collect()
}

/// name -> path (None: not found) of one file's closure in gpubake's JSON report, without the
/// dynamic loader itself (ldd and lddtree name it each their own way).
fn gpubake_map(report: &serde_json::Value, file: &str) -> BTreeMap<String, Option<String>> {
    let closure = report["closures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["file"] == file)
        .unwrap_or_else(|| panic!("no closure of {file}"));
    let mut map = BTreeMap::new();
    for b in closure["libraries"].as_array().unwrap() {
        let name = b["needed"].as_str().unwrap().to_string();
        if name.starts_with("ld-linux") {
            continue;
        }
        map.entry(name)
            .or_insert_with(|| b["path"].as_str().map(str::to_string));
    }
    map
}

/// name -> path from `ldd` output lines (`name => path (addr)`, `name => not found`), or
/// lddtree's (`name => path`, `name => None`).
fn ldd_map(text: &str) -> BTreeMap<String, Option<String>> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split(" (").next().unwrap().trim();
            Some((
                name.to_string(),
                (path != "not found" && path != "None").then(|| path.to_string()),
            ))
        })
        .filter(|(name, _)| !name.starts_with("ld-linux") && !name.contains(" (interpreter"))
        .collect()
}

fn inspect(image: &str) -> serde_json::Value {
    let out = gpubake(&["inspect", "--libraries", "--json", image]);
    assert_exit(&out, 0);
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// The report names the duplicates, which copy each file binds, the cross-copy binding, the
/// unresolved library, the compat libcuda and the dead copy's bytes; and every binding is the
/// one `ldd` prints inside the container.
#[test]
fn inspect_libraries_reports_an_image_it_did_not_build_as_ldd_sees_it() {
    let Some((tag, ctx)) = image() else {
        return;
    };
    let reference = format!("docker-daemon:{}", tag);
    let report = inspect(&reference);

    // ldd inside the container, one file after another.
    let script: String = files()
        .iter()
        .map(|f| format!("echo '== {f}'; ldd {f};"))
        .collect();
    let out = Command::new("docker")
        .args(["run", "--rm", "--entrypoint", "sh", &tag, "-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut compared = 0;
    for part in text.split("== ").skip(1) {
        let (file, body) = part.split_once('\n').unwrap();
        let want = ldd_map(body);
        assert!(!want.is_empty(), "ldd printed nothing for {file}:\n{text}");
        assert_eq!(gpubake_map(&report, file), want, "the closure of {file}");
        compared += 1;
    }
    assert_eq!(compared, files().len(), "ldd output:\n{text}");

    // The cross-copy binding: app-rpath's libfoo from the wheel, its libbar from /opt/cuda.
    let cross = report["cross_copy"].as_array().unwrap();
    assert!(
        cross.iter().any(|x| x["file"] == "/usr/local/bin/app-rpath"
            && [x["bound"].as_str(), x["sibling_bound"].as_str()]
                .contains(&Some("/opt/wheel/lib/libfoo.so.1"))
            && [x["bound"].as_str(), x["sibling_bound"].as_str()]
                .contains(&Some("/opt/cuda/lib/libbar.so.1"))),
        "{cross:#?}"
    );
    assert!(
        !cross
            .iter()
            .any(|x| x["file"] == "/usr/local/bin/app-plain"),
        "app-plain binds both from /opt/cuda: {cross:#?}"
    );
    // Duplicates and who binds each copy.
    let dup = |soname: &str| {
        report["duplicates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["soname"] == soname)
            .unwrap_or_else(|| panic!("{soname} is not reported twice: {report:#}"))
            .clone()
    };
    let bound_by = |d: &serde_json::Value, path: &str| -> Vec<String> {
        let p = d["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["path"] == path)
            .unwrap_or_else(|| panic!("{path} is no provider: {d:#}"));
        serde_json::from_value(p["bound_by"].clone()).unwrap()
    };
    // Only shared libraries by their DT_SONAME: the base's perl plugins, two copies of each
    // without a soname that nothing binds, are no duplicates.
    let sonames: Vec<&str> = report["duplicates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["soname"].as_str().unwrap())
        .collect();
    assert_eq!(sonames, ["libbar.so.1", "libcudart.so.12", "libfoo.so.1"]);
    let foo = dup("libfoo.so.1");
    assert!(
        bound_by(&foo, "/opt/wheel/lib/libfoo.so.1").contains(&"/usr/local/bin/app-rpath".into())
    );
    assert!(
        bound_by(&foo, "/opt/cuda/lib/libfoo.so.1").contains(&"/usr/local/bin/app-plain".into())
    );
    let cudart = dup("libcudart.so.12");
    let wheel_cudart = format!("{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12");
    assert_eq!(
        bound_by(&cudart, &wheel_cudart),
        vec![format!("{SITE}/cudauser.so")]
    );
    assert!(bound_by(&cudart, "/usr/local/cuda/lib64/libcudart.so.12").is_empty());
    // The dead copies: the /usr/local/cuda libcudart, with its bytes, and the wheel's libbar.
    let size =
        std::fs::metadata(wheel_cudart.replace(SITE, &format!("{}/rootfs{SITE}", ctx.display())))
            .unwrap()
            .len();
    let dead: Vec<(String, u64)> = serde_json::from_value(report["dead"].clone()).unwrap();
    assert!(
        dead.contains(&("/usr/local/cuda/lib64/libcudart.so.12".into(), size)),
        "{dead:?}"
    );
    assert!(
        dead.iter().any(|(p, _)| p == "/opt/wheel/lib/libbar.so.1"),
        "{dead:?}"
    );
    assert_eq!(
        report["dead_bytes"].as_u64().unwrap(),
        dead.iter().map(|(_, b)| b).sum::<u64>()
    );
    // The unresolved library, in the Python stack; the compat libcuda on LD_LIBRARY_PATH.
    let unresolved = report["unresolved"].as_array().unwrap();
    assert!(
        unresolved
            .iter()
            .any(|u| u["file"] == format!("{SITE}/cudauser.so") && u["needed"] == "libgone.so.1"),
        "{unresolved:#?}"
    );
    let compat = report["compat_libcuda"].as_array().unwrap();
    assert!(
        compat.iter().any(|c| c
            .as_str()
            .unwrap()
            .starts_with("/usr/local/cuda/compat/libcuda.so.1")),
        "{compat:?}"
    );

    // The text report says the same to a person.
    let out = gpubake(&["inspect", "--libraries", &reference]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    for want in [
        "Cross-copy bindings: ",
        "/usr/local/bin/app-rpath binds",
        "libgone.so.1",
        "/usr/local/cuda/lib64/libcudart.so.12",
        "bound by nothing",
        "/usr/local/cuda/compat/libcuda.so.1",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
}

/// Debian's lddtree (pax-utils), run in a chroot of the unpacked root with the image's
/// LD_LIBRARY_PATH, binds what gpubake binds, file for file, but for the one place where
/// lddtree departs from ld.so: it searches the main program's DT_RPATH for the needs of a
/// library that has DT_RUNPATH, which ld.so does not (there gpubake binds what `ldd` prints,
/// as the test above shows). Under `--root` lddtree expands $ORIGIN to a path with the root
/// prefixed twice, so the chroot stands in for it.
#[test]
fn the_binding_map_equals_lddtree_over_the_unpacked_root() {
    let Some((tag, _)) = image() else {
        return;
    };
    if !common::have("lddtree", "--version") {
        return;
    }
    let unpacked = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let root = unpacked.path().to_path_buf();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "id=$(docker create {tag}) && docker export $id | tar -x -C {r}; rc=$?; docker rm $id >/dev/null; exit $rc",
            r = root.display(),
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // lddtree and the pyelftools it imports, copied into the root for its python3.
    let tool = root.join("tmp/lddtree");
    std::fs::create_dir_all(&tool).unwrap();
    let elftools = Command::new("python3")
        .args([
            "-c",
            "import elftools, os; print(os.path.dirname(elftools.__file__))",
        ])
        .output()
        .unwrap();
    let elftools = String::from_utf8_lossy(&elftools.stdout).trim().to_string();
    let lddtree = String::from_utf8_lossy(
        &Command::new("sh")
            .args(["-c", "command -v lddtree"])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .to_string();
    let copy = Command::new("cp")
        .arg("-r")
        .arg(&elftools)
        .arg(&lddtree)
        .arg(&tool)
        .output()
        .unwrap();
    assert!(
        copy.status.success(),
        "{}",
        String::from_utf8_lossy(&copy.stderr)
    );
    let env = [("LD_LIBRARY_PATH".to_string(), LD_LIBRARY_PATH.to_string())];
    let report =
        serde_json::to_value(gpubake::image::links::analyze(&root, &env).unwrap()).unwrap();
    // `inspect` and certify read the layers into memory, never writing the files out: what
    // they find is what the walk of the root the engine exported finds, binding by binding.
    assert_eq!(
        inspect(&format!("docker-daemon:{tag}")),
        report,
        "the layers read in memory against the exported root"
    );
    let as_root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
    for file in files() {
        let mut cmd = Command::new(if as_root { "chroot" } else { "unshare" });
        if !as_root {
            cmd.args(["-r", "chroot"]);
        }
        let out = cmd
            .arg(&root)
            .args(["env", "-i", "PYTHONPATH=/tmp/lddtree"])
            .arg(format!("LD_LIBRARY_PATH={LD_LIBRARY_PATH}"))
            .args(["python3", "/tmp/lddtree/lddtree", "-a", &file])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut want = ldd_map(&text);
        assert!(
            !want.is_empty(),
            "lddtree {file}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = gpubake_map(&report, &file);
        if file == "/usr/local/bin/app-rpath" {
            assert_eq!(
                want.insert(
                    "libbar.so.1".into(),
                    Some("/opt/cuda/lib/libbar.so.1".into())
                ),
                Some(Some("/opt/wheel/lib/libbar.so.1".into())),
                "lddtree's departure from ld.so:\n{text}"
            );
        }
        assert_eq!(got, want, "the closure of {file}:\n{text}");
    }
}

/// certify fails an image with a cross-copy binding, naming it, and still exits by its rule.
#[test]
fn certify_fails_a_cross_copy_binding() {
    let Some((tag, _)) = image() else {
        return;
    };
    let out = gpubake(&[
        "certify",
        &format!("docker-daemon:{}", tag),
        "--gpus",
        "none",
    ]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.contains("link closure"))
        .unwrap_or_else(|| panic!("no link closure check:\n{text}"));
    assert!(line.contains("FAIL"), "{line}");
    assert!(line.contains("/usr/local/bin/app-rpath binds"), "{line}");
    assert!(line.contains("libgone.so.1"), "{line}");
}
