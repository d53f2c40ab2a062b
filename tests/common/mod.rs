//! Helpers shared by the integration tests: run the real binary, write recipes to temp dirs.
#![allow(dead_code)]

pub mod go;
pub mod nvml;
pub mod stack;
pub mod toc;
pub mod wheels;
pub mod world;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root, where `recipes/` and `env-presets/` live.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs gpubake with `args` in the repository root.
pub fn gpubake(args: &[&str]) -> Output {
    gpubake_in(&root(), args)
}

/// Runs gpubake with `args` in `dir`.
pub fn gpubake_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(args)
        .current_dir(dir)
        .env_remove("GPUBAKE_PRESET_PATH")
        .output()
        .expect("the gpubake binary runs")
}

/// Runs gpubake with `args` in the repository root under the umask `mask` (octal, as the
/// shell's `umask` takes it).
pub fn gpubake_umask(mask: &str, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("umask {mask} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_gpubake"))
        .args(args)
        .current_dir(root())
        .env_remove("GPUBAKE_PRESET_PATH")
        .output()
        .expect("sh runs the gpubake binary")
}

/// The permission bits of `path`.
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Standard output as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts an exit code and that nothing panicked, showing both streams on failure.
pub fn assert_exit(out: &Output, code: i32) {
    let err = stderr(out);
    assert!(!err.contains("panicked"), "gpubake panicked:\n{err}");
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit {code}\nstdout:\n{}\nstderr:\n{err}",
        stdout(out)
    );
}

/// Writes `text` to `dir/name` and returns the path as a string.
pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Runs `cmd`, failing the test with its output unless it succeeds; returns its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `mib` MiB of bytes that no compressor shrinks (xorshift noise from `seed`) to `path`.
pub fn noise(path: &Path, mib: usize, seed: u64) {
    let mut noise = Vec::with_capacity(mib << 20);
    let mut x = seed;
    while noise.len() < mib << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, &noise).unwrap();
}

/// The busybox base of [`base`] as a transport.
pub fn from_base() -> String {
    format!("oci:{}:latest", base().display())
}

/// The arguments of a build without the Python stack, the one most image tests make:
/// `build --without-python RECIPE --from FROM --to TO`, then `extra`.
pub fn build_args<'a>(
    recipe: &'a str,
    from: &'a str,
    to: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "build",
        "--without-python",
        recipe,
        "--from",
        from,
        "--to",
        to,
    ];
    args.extend(extra);
    args
}

/// Builds `recipe` on the busybox base into `to` (`--json` added), in `dir`, and returns the
/// build's JSON report, failing the test unless the build succeeds.
pub fn build_json_in(dir: &Path, recipe: &str, to: &str, extra: &[&str]) -> serde_json::Value {
    let from = from_base();
    let mut args = build_args(recipe, &from, to, &["--json"]);
    args.extend(extra);
    let out = gpubake_in(dir, &args);
    assert_exit(&out, 0);
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

/// A minimal recipe with the given extra lines.
pub fn recipe(extra: &str) -> String {
    format!("name: test\nbase: ubuntu:24.04\n{extra}")
}

/// A busybox base in an OCI layout, made by umoci (scripts/make-test-base), with the
/// libraries gpubake links against. Made once and kept in the target directory.
pub fn base() -> PathBuf {
    static BASE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let layout = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("busybox-base");
        if !layout.join("index.json").exists() {
            let staging = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            let tmp = staging.path().join("layout");
            let out = Command::new(root().join("scripts/make-test-base"))
                .arg(&tmp)
                .arg(env!("CARGO_BIN_EXE_gpubake"))
                .output()
                .expect("scripts/make-test-base runs");
            assert!(
                out.status.success(),
                "make-test-base: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Another test binary may have made it meanwhile; either copy is fine.
            let _ = std::fs::rename(&tmp, &layout);
        }
        layout
    })
    .clone()
}

/// Whether `unshare --mount` makes a private mount namespace here (root, or CAP_SYS_ADMIN),
/// where a test mounts a tmpfs or a loop image without touching the host; in CI it must.
pub fn private_mounts_work() -> bool {
    let ok = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs the tests as root, where `unshare --mount` works"
        );
        eprintln!("skipped: `unshare --mount` needs root (or CAP_SYS_ADMIN)");
    }
    ok
}

/// True when `tool` runs; in CI its absence fails the test instead of skipping it.
pub fn have(tool: &str, arg: &str) -> bool {
    let ok = Command::new(tool)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs {tool}; it must run"
        );
        eprintln!("skipped: {tool} is not available");
    }
    ok
}

/// The tools the image tests need: umoci and busybox for the base, skopeo to read images.
pub fn tools() -> bool {
    have("umoci", "--version")
        && have("skopeo", "--version")
        && std::path::Path::new("/bin/busybox").exists()
}

/// A real Debian bookworm base with CPython 3.11 in an OCI layout (scripts/make-debian-base,
/// mmdebstrap from Debian's archive), tagged `bookworm`. Made once and kept in the target
/// directory; None (with the reason printed) where mmdebstrap or umoci is missing outside CI.
pub fn debian_base() -> Option<PathBuf> {
    static BASE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| made_base("debian-base", "bookworm"))
        .clone()
}

/// A real Ubuntu 24.04 base with CPython 3.12, as [`debian_base`] makes it from Ubuntu's
/// archive, tagged `noble`.
pub fn ubuntu_base() -> Option<PathBuf> {
    static BASE: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BASE.get_or_init(|| made_base("ubuntu-base", "noble"))
        .clone()
}

fn made_base(name: &str, tag: &str) -> Option<PathBuf> {
    if !have("mmdebstrap", "--version") || !have("umoci", "--version") {
        return None;
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is inside the target directory")
        .to_path_buf();
    let layout = target.join(name);
    let lock = std::fs::File::create(target.join(format!("{name}.lock"))).unwrap();
    // Several test binaries may ask at once: one makes it, the others wait.
    lock.lock().unwrap();
    if !layout.join("index.json").exists() {
        let staging = tempfile::tempdir_in(&target).unwrap();
        let tmp = staging.path().join("layout");
        let out = Command::new(root().join("scripts/make-debian-base"))
            .arg(&tmp)
            .arg(tag)
            .output()
            .expect("scripts/make-debian-base runs");
        // Exit 3: the machine cannot reach the archive, which the tests that need this base
        // say as they skip.
        if out.status.code() == Some(3) {
            eprintln!("skipped: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
        assert!(
            out.status.success(),
            "make-debian-base: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &layout).unwrap();
    }
    Some(layout)
}

/// Writes an OCI index over `manifests`, each with its platform (`linux/arm64`), into
/// `layout`, and tags it `tag` beside the layout's other tags; returns the index's descriptor.
pub fn tag_index(
    layout: &gpubake::image::layout::Layout,
    manifests: &[(&oci_spec::image::Descriptor, &str)],
    tag: &str,
) -> oci_spec::image::Descriptor {
    use oci_spec::image::{Descriptor, ImageIndexBuilder, MediaType};
    let entries = manifests
        .iter()
        .map(|(desc, platform)| {
            let mut d =
                Descriptor::new(MediaType::ImageManifest, desc.size(), desc.digest().clone());
            let p: gpubake::image::Platform = platform.parse().unwrap();
            d.set_platform(Some(p.to_oci()));
            d
        })
        .collect::<Vec<_>>();
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(entries)
        .build()
        .unwrap();
    let mut index_desc = layout.write_json(&index, MediaType::ImageIndex).unwrap();
    index_desc.set_annotations(Some(std::collections::HashMap::from([(
        gpubake::image::layout::REF_NAME.to_string(),
        tag.to_string(),
    )])));
    let mut top = layout.index().unwrap();
    let mut all = top.manifests().clone();
    all.push(index_desc.clone());
    top.set_manifests(all);
    layout.write_index(&top).unwrap();
    index_desc
}

/// The busybox base written by skopeo into a docker archive at `path` (as skopeo writes one:
/// `manifest.json`, the config as `HEX.json`, each layer uncompressed as `HEX.tar`, and no
/// manifest of the image).
pub fn skopeo_archive(path: &Path) -> String {
    let archive = format!("docker-archive:{}", path.display());
    run(Command::new("skopeo")
        .arg("copy")
        .arg(from_base())
        .arg(&archive));
    archive
}

/// Where the data of `member` starts in the tar at `archive`, and its size.
pub fn member_data(archive: &Path, member: &str) -> (u64, u64) {
    let mut tar = tar::Archive::new(std::fs::File::open(archive).unwrap());
    for entry in tar.entries().unwrap() {
        let entry = entry.unwrap();
        if entry.path().unwrap() == Path::new(member) {
            return (entry.raw_file_position(), entry.size());
        }
    }
    panic!("{} holds no {member}", archive.display());
}

/// Docker's `manifest.json` of the tar at `archive`: the config member and the layer members.
pub fn archive_members(archive: &Path) -> (String, Vec<String>) {
    let (at, size) = member_data(archive, "manifest.json");
    let bytes = std::fs::read(archive).unwrap();
    let m: serde_json::Value =
        serde_json::from_slice(&bytes[at as usize..(at + size) as usize]).unwrap();
    let layers = m[0]["Layers"].as_array().unwrap();
    (
        m[0]["Config"].as_str().unwrap().to_string(),
        layers
            .iter()
            .map(|l| l.as_str().unwrap().to_string())
            .collect(),
    )
}

/// Flips one bit of the byte at `offset` of `path`, in a new file under that name: a blob's
/// other hard links (the cache's, another layout's) keep their bytes.
pub fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x40;
    std::fs::remove_file(path).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A copy of the skopeo archive `good` at `bad` with one byte of a file's content in its first
/// layer flipped: every member is whole, but the layer no longer has the config's diff id.
pub fn tampered_archive(good: &Path, bad: &Path) {
    std::fs::copy(good, bad).unwrap();
    let (_, layers) = archive_members(good);
    let (at, size) = member_data(good, &layers[0]);
    let bytes = std::fs::read(good).unwrap();
    let layer = &bytes[at as usize..(at + size) as usize];
    let mut inner = tar::Archive::new(layer);
    let (pos, len) = inner
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.size() > 16)
        .map(|e| (e.raw_file_position(), e.size()))
        .expect("the layer holds a file");
    flip_byte(bad, at + pos + len / 2);
}

/// The entries of a layout's blob directory and its `index.json`: what a failed write must
/// leave as it found them.
pub fn layout_state(layout: &Path) -> (Vec<String>, Vec<u8>) {
    let mut blobs: Vec<String> = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    blobs.sort();
    (blobs, std::fs::read(layout.join("index.json")).unwrap())
}

/// Runs gcc with `args` in `dir`, failing the test with gcc's own words.
pub fn gcc<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S]) {
    let out = Command::new("gcc")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc {:?}: {}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
}
