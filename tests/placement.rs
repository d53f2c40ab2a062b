//! How a layout destination and gpubake's layer cache hold the same blob: each its own file
//! (a reflink where the filesystem clones, else a copy), so that a file of one changed in
//! place leaves the others verifying; with `--link-blobs`, one file by hard link, which the
//! option's help says a change in place damages everywhere. The reflink case runs on an XFS
//! image loop-mounted in a private mount namespace.

mod common;

use common::{assert_exit, build_args, from_base, stdout, write};
use serde_json::Value;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A recipe with a files layer of 2 MiB of noise, which the cache keeps.
fn recipe_in(dir: &Path) -> String {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    common::noise(&dir.join("data/weights.bin"), 2, 7);
    write(
        dir,
        "recipe.yaml",
        "name: placed\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\n\
         files:\n  - {src: data, dest: /data}\n",
    )
}

fn build(cache: &Path, recipe: &str, layout: &Path, extra: &[&str]) -> Value {
    let to = format!("oci:{}:v1", layout.display());
    let from = from_base();
    let mut args = build_args(recipe, &from, &to, &["--json"]);
    args.extend(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(&args)
        .env("GPUBAKE_CACHE_DIR", cache)
        .output()
        .unwrap();
    assert_exit(&out, 0);
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn verify(layout: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(["verify", &format!("oci:{}:v1", layout.display())])
        .output()
        .unwrap()
}

/// The files layer's line of a build report.
fn files_layer(report: &Value) -> &Value {
    report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "files")
        .unwrap_or_else(|| panic!("no files layer: {report}"))
}

/// Every regular file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    found
}

/// The files (device, inode) under `dir`.
fn inodes(dir: &Path) -> HashSet<(u64, u64)> {
    files_under(dir)
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).unwrap();
            (m.dev(), m.ino())
        })
        .collect()
}

/// Changes one byte of `path` in place, as an editor that writes into the file does: the
/// same inode, another content.
fn change_in_place(path: &Path) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = f.metadata().unwrap().len();
    if len == 0 {
        f.write_all(b"x").unwrap();
        return;
    }
    let at = len / 2;
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut byte).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[byte[0] ^ 0x20]).unwrap();
}

/// Whether `dir`'s filesystem clones files (what `cp --reflink=always` asks of it).
fn clones_files(dir: &Path) -> bool {
    let (a, b) = (dir.join(".clone-probe"), dir.join(".clone-probe-2"));
    std::fs::write(&a, b"probe").unwrap();
    let ok = Command::new("cp")
        .args(["--reflink=always"])
        .arg(&a)
        .arg(&b)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let _ = (std::fs::remove_file(&a), std::fs::remove_file(&b));
    ok
}

#[test]
fn layouts_share_no_writable_file_with_the_cache_or_with_each_other() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path());
    let cache = dir.path().join("cache");
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    let expected = if clones_files(dir.path()) {
        "reflink"
    } else {
        "copy"
    };
    // `a` writes the layer and gives the cache its own copy; `b` takes one from the cache.
    let first = build(&cache, &recipe, &a, &[]);
    assert_eq!(files_layer(&first)["from"], "written", "{first}");
    assert_eq!(files_layer(&first)["placed"], expected, "{first}");
    let second = build(&cache, &recipe, &b, &[]);
    assert_eq!(files_layer(&second)["from"], "local-cache", "{second}");
    assert_eq!(files_layer(&second)["placed"], expected, "{second}");
    assert_eq!(second["manifest"], first["manifest"]);

    let cache_layout = cache.join("layout");
    let (in_a, in_b, in_cache) = (inodes(&a), inodes(&b), inodes(&cache_layout));
    assert!(in_a.is_disjoint(&in_b), "a and b share a file");
    assert!(
        in_b.is_disjoint(&in_cache),
        "b shares a file with the cache"
    );
    assert!(
        in_a.is_disjoint(&in_cache),
        "a shares a file with the cache"
    );

    // Every blob of b changed in place: b is damaged (verify says so)...
    for file in files_under(&b.join("blobs")) {
        change_in_place(&file);
    }
    assert_ne!(verify(&b).status.code(), Some(0), "b's damage went unseen");
    // ... and then every other file of b too: a is not damaged, nor is the cache.
    for file in files_under(&b) {
        if !file.starts_with(b.join("blobs")) {
            change_in_place(&file);
        }
    }
    assert_exit(&verify(&a), 0);
    let third = build(&cache, &recipe, &c, &[]);
    assert_eq!(files_layer(&third)["from"], "local-cache", "{third}");
    assert_eq!(third["manifest"], first["manifest"]);
    assert_exit(&verify(&c), 0);

    // Every blob of the cache changed in place: the layouts built from it still verify.
    for file in files_under(&cache_layout.join("blobs")) {
        change_in_place(&file);
    }
    assert_exit(&verify(&a), 0);
    assert_exit(&verify(&c), 0);
}

#[test]
fn link_blobs_makes_one_file_of_each_blob_and_the_cache_drops_one_changed_in_place() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path());
    let cache = dir.path().join("cache");
    let (d, e, f) = (
        dir.path().join("d"),
        dir.path().join("e"),
        dir.path().join("f"),
    );
    let first = build(&cache, &recipe, &d, &["--link-blobs"]);
    assert_eq!(files_layer(&first)["placed"], "link", "{first}");
    let second = build(&cache, &recipe, &e, &["--link-blobs"]);
    assert_eq!(files_layer(&second)["placed"], "link", "{second}");
    let hex = files_layer(&second)["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let blob = |layout: &Path| layout.join("blobs/sha256").join(&hex);
    let cached = cache.join("layout/blobs/sha256").join(&hex);
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    assert_eq!(ino(&blob(&d)), ino(&cached));
    assert_eq!(ino(&blob(&e)), ino(&cached));

    // What the option's help warns of: one change in place is a change to all of them.
    change_in_place(&blob(&e));
    assert_ne!(
        verify(&d).status.code(),
        Some(0),
        "d did not share e's file"
    );
    // The cache reads its blob through before handing it on: the damaged one is dropped and
    // the layer written again, whatever the placement.
    let third = build(&cache, &recipe, &f, &[]);
    assert_eq!(files_layer(&third)["from"], "written", "{third}");
    assert_eq!(third["manifest"], first["manifest"]);
    assert_exit(&verify(&f), 0);
    assert_ne!(ino(&cached), ino(&blob(&e)));
    assert_ne!(ino(&cached), ino(&blob(&f)));
    // The cache holds the sound blob again.
    let bytes = std::fs::read(&cached).unwrap();
    assert_eq!(
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
        hex
    );
}

/// The reflink scenario on an XFS image mounted in a private mount namespace; results land
/// in $OUT, outside it.
const ON_XFS: &str = r#"
set -u
truncate -s 400M "$WORK/xfs.img"
mkfs.xfs -q "$WORK/xfs.img" >"$OUT/mkfs" 2>&1 || exit 90
mount -o loop "$WORK/xfs.img" "$DISK" >"$OUT/mount" 2>&1 || exit 91
export GPUBAKE_CACHE_DIR="$DISK/cache"
run() { # NAME COMMAND...
  name=$1; shift
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; echo $? >"$OUT/$name.rc"
}
run a "$GPUBAKE" build --without-python "$RECIPE" --from "$BASE" --to "oci:$DISK/a:v1" --json
run b "$GPUBAKE" build --without-python "$RECIPE" --from "$BASE" --to "oci:$DISK/b:v1" --json
damage() { # DIR: one byte of every file under it, changed in place
  find "$1" -type f | while read -r f; do
    printf 'X' | dd of="$f" bs=1 seek=7 conv=notrunc status=none
  done
}
damage "$DISK/b/blobs"
run verify-b "$GPUBAKE" verify "oci:$DISK/b:v1"
damage "$DISK/b"
run verify-a "$GPUBAKE" verify "oci:$DISK/a:v1"
run c "$GPUBAKE" build --without-python "$RECIPE" --from "$BASE" --to "oci:$DISK/c:v1" --json
run verify-c "$GPUBAKE" verify "oci:$DISK/c:v1"
umount "$DISK"
exit 0
"#;

#[test]
fn on_a_filesystem_that_clones_files_the_blobs_are_reflinks() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Each says why it skips, and fails the test in CI instead.
    if !common::have("mkfs.xfs", "-V") || !common::private_mounts_work() {
        return;
    }
    let (out, disk) = (dir.path().join("out"), dir.path().join("disk"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&disk).unwrap();
    let recipe = recipe_in(dir.path());
    let status = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", ON_XFS])
        .env("WORK", dir.path())
        .env("DISK", &disk)
        .env("OUT", &out)
        .env("GPUBAKE", env!("CARGO_BIN_EXE_gpubake"))
        .env("BASE", from_base())
        .env("RECIPE", &recipe)
        .status()
        .unwrap();
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    if status.code() == Some(91) && std::env::var_os("CI").is_none() {
        eprintln!(
            "skipped: a loop device cannot be mounted here: {}",
            read("mount")
        );
        return;
    }
    assert_eq!(status.code(), Some(0), "{}{}", read("mkfs"), read("mount"));
    for name in ["a", "b", "verify-a", "c", "verify-c"] {
        assert_eq!(
            read(&format!("{name}.rc")).trim(),
            "0",
            "{name}: {}",
            read(&format!("{name}.err"))
        );
    }
    let report =
        |name: &str| -> Value { serde_json::from_str(&read(&format!("{name}.out"))).unwrap() };
    let (a, b) = (report("a"), report("b"));
    assert_eq!(files_layer(&a)["placed"], "reflink", "{a}");
    assert_eq!(files_layer(&b)["placed"], "reflink", "{b}");
    assert_eq!(files_layer(&b)["from"], "local-cache", "{b}");
    // The cache was not damaged with b: c takes the layer from it, and verifies.
    let c = report("c");
    assert_eq!(files_layer(&c)["from"], "local-cache", "{c}");
    assert_eq!(c["manifest"], a["manifest"]);
    assert_ne!(read("verify-b.rc").trim(), "0", "b's damage went unseen");
}

#[test]
fn link_blobs_is_refused_where_no_layout_is_written() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path());
    let archive = dir.path().join("image.tar");
    let to = format!("docker-archive:{}:placed:v1", archive.display());
    let from = from_base();
    let mut args = build_args(&recipe, &from, &to, &[]);
    args.push("--link-blobs");
    let out = Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(&args)
        .env("GPUBAKE_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert_exit(&out, 2);
    let err = common::stderr(&out);
    assert!(err.contains("--link-blobs") && err.contains(&to), "{err}");
    assert!(!archive.exists(), "an archive was written");
    assert!(!dir.path().join("cache/layout").exists(), "the build began");
}
