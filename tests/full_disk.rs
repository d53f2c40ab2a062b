//! Builds onto a full disk: a small tmpfs mounted in a private mount namespace (`unshare -m`,
//! so nothing is mounted on the host), holding a layout with an image, then filled. The build
//! must fail as the environment's fault (exit 3) naming the device's complaint and the file,
//! leave `index.json` as it was and no partial blob, image or archive, and the previous image
//! must still verify and be read by skopeo; with space again, the same build succeeds.

mod common;

use std::path::Path;
use std::process::Command;

/// The scenario, run inside the namespace; every result lands in $OUT, outside the tmpfs.
const SCENARIO: &str = r#"
set -u
mount -t tmpfs -o size=256m gpubake-full-disk "$DISK" || exit 90
build() { # NAME RECIPE DEST
  "$GPUBAKE" build --without-python "$2" --from "$BASE" --to "$3" >"$OUT/$1.out" 2>"$OUT/$1.err"
  echo $? >"$OUT/$1.rc"
}
check() { # NAME COMMAND...
  name=$1; shift
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; echo $? >"$OUT/$name.rc"
}
build v1 "$R1" "oci:$DISK/layout:v1"
cp "$DISK/layout/index.json" "$OUT/index.before"
# Leave 2 MiB: the 8 MiB of random data in v2's files layer cannot fit.
avail=$(df --output=avail -B1 "$DISK" | tail -1)
head -c $((avail - 2097152)) /dev/zero >"$DISK/filler"
df -B1 "$DISK" >"$OUT/df"
build v2-full "$R2" "oci:$DISK/layout:v2"
cp "$DISK/layout/index.json" "$OUT/index.after"
ls -A "$DISK/layout" "$DISK/layout/blobs/sha256" >"$OUT/listing"
check verify-v1 "$GPUBAKE" verify "oci:$DISK/layout:v1"
check skopeo-v1 skopeo inspect "oci:$DISK/layout:v1"
# A layout the build creates, and an archive, on the full disk.
build fresh-full "$R2" "oci:$DISK/fresh:v2"
build archive-full "$R2" "docker-archive:$DISK/v2.tar"
ls -A "$DISK" >"$OUT/disk-listing"
rm "$DISK/filler"
build v2 "$R2" "oci:$DISK/layout:v2"
check verify-v2 "$GPUBAKE" verify "oci:$DISK/layout:v2"
check verify-v1-again "$GPUBAKE" verify "oci:$DISK/layout:v1"
exit 0
"#;

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn rc(dir: &Path, name: &str) -> i32 {
    read(dir, &format!("{name}.rc")).trim().parse().unwrap()
}

#[test]
fn a_full_disk_fails_the_build_cleanly_and_keeps_the_previous_image() {
    if !common::tools() || !common::private_mounts_work() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let disk = dir.path().join("disk");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&disk).unwrap();
    let recipe = |name: &str, extra: &str| {
        common::write(
            dir.path(),
            name,
            &format!("name: full\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\n{extra}"),
        )
    };
    let r1 = recipe("v1.yaml", "");
    // Random bytes do not compress: the layer needs its full 8 MiB.
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let noise: Vec<u8> = (0..8 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(dir.path().join("noise.bin"), noise).unwrap();
    let r2 = recipe(
        "v2.yaml",
        "files: [{src: noise.bin, dest: /data/noise.bin}]\n",
    );
    let status = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", SCENARIO])
        .env("DISK", &disk)
        .env("OUT", &out)
        .env("GPUBAKE", env!("CARGO_BIN_EXE_gpubake"))
        .env("BASE", format!("oci:{}:latest", common::base().display()))
        .env("R1", &r1)
        .env("R2", &r2)
        .env("GPUBAKE_CACHE_DIR", dir.path().join("cache"))
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0), "the scenario did not run");
    assert_eq!(rc(&out, "v1"), 0, "{}", read(&out, "v1.err"));

    // The build on the full disk: exit 3, the device's complaint and the file it hit.
    let err = read(&out, "v2-full.err");
    assert_eq!(rc(&out, "v2-full"), 3, "{err}\n{}", read(&out, "df"));
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    // The side that failed, the destination, and what its filesystem has free.
    assert!(
        err.contains(&format!("writing {}", disk.join("layout").display())),
        "{err}"
    );
    assert!(err.contains(" free there"), "{err}");
    // Nothing changed where readers look, and nothing half-written stayed.
    assert_eq!(read(&out, "index.before"), read(&out, "index.after"));
    let listing = read(&out, "listing");
    assert!(
        !listing.contains(".tmp-"),
        "a partial blob stayed:\n{listing}"
    );
    assert!(
        !listing
            .lines()
            .any(|l| l.starts_with(".gpubake-") && l != ".gpubake-lock"),
        "a partial index stayed:\n{listing}"
    );
    assert_eq!(rc(&out, "verify-v1"), 0, "{}", read(&out, "verify-v1.out"));
    assert_eq!(rc(&out, "skopeo-v1"), 0, "{}", read(&out, "skopeo-v1.err"));

    // A layout the build would have created, and an archive, are not left half-made.
    for name in ["fresh-full", "archive-full"] {
        let err = read(&out, &format!("{name}.err"));
        assert_eq!(rc(&out, name), 3, "{name}: {err}");
        assert!(err.contains("No space left on device"), "{name}: {err}");
    }
    let on_disk = read(&out, "disk-listing");
    assert_eq!(
        on_disk.split_whitespace().collect::<Vec<_>>(),
        ["filler", "layout"],
        "left on the full disk"
    );

    // With space again, the same build succeeds and both images verify.
    assert_eq!(rc(&out, "v2"), 0, "{}", read(&out, "v2.err"));
    assert_eq!(rc(&out, "verify-v2"), 0, "{}", read(&out, "verify-v2.out"));
    assert_eq!(rc(&out, "verify-v1-again"), 0);
}
