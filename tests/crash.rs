//! gpubake killed with SIGKILL while it writes, then run again, as a crashed CI job or a lost
//! node leaves it: the same command succeeds with the digest of an uninterrupted run, the
//! image verifies, no temporary file is left in the layout, the archive's folder or the
//! cache, and the cache holds what an uninterrupted run leaves there. Each kill point is
//! chosen by what the process is doing: a layer blob being written, `index.json` being
//! replaced (strace's fault injection kills at that rename), an archive being written, blobs
//! being uploaded to a registry or downloaded from one. `gpubake gc` is tested on a layout
//! and a cache with such leftovers, and beside a live build.
//!
//! GPUBAKE_CRASH_TEST_BIN=PATH runs the scenarios with another gpubake binary (an earlier
//! release, to see what it left behind).

mod common;
#[allow(dead_code)]
#[path = "common/local_registry.rs"]
mod local_registry;

use common::{from_base, write};
use local_registry::local_registry;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> PathBuf {
    std::env::var_os("GPUBAKE_CRASH_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpubake")))
}

/// gpubake with `args`, its cache at `cache`.
fn gpubake(cache: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env("GPUBAKE_CACHE_DIR", cache)
        .env_remove("GPUBAKE_PRESET_PATH");
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("gpubake runs")
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{:?}: {}\n{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The manifest digest a `build --json` or `copy --json` reports.
fn manifest(json: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    v["manifest"]
        .as_str()
        .unwrap_or_else(|| panic!("no manifest: {json}"))
        .to_string()
}

/// Temporary files of any release of gpubake anywhere under `root`: owned (`.gpubake-tmp-`),
/// not yet owned (`.gpubake-new-`), and the names earlier releases gave them (`.tmp-*` blobs,
/// `.gpubake-XXXXXX` replacements).
fn temp_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let legacy_replacement = name.strip_prefix(".gpubake-").is_some_and(|rest| {
                rest.len() == 6 && rest.bytes().all(|b| b.is_ascii_alphanumeric()) && rest != "lock"
            });
            if name.starts_with(".gpubake-tmp-")
                || name.starts_with(".gpubake-new-")
                || name.starts_with(".tmp-")
                || legacy_replacement
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Fails the test when a temporary file is left under any of `places`.
fn no_temp_files(places: &[&Path]) {
    for place in places {
        let left = temp_files(place);
        assert!(left.is_empty(), "left in {}: {left:?}", place.display());
    }
}

/// The cache's entries, by name: the layer cache's records and blobs.
fn cache_entries(cache: &Path) -> Vec<String> {
    let layout = cache.join("layout");
    let mut names: Vec<String> = Vec::new();
    for dir in ["blobs/sha256", ".gpubake/layers", ".gpubake/stack"] {
        for entry in std::fs::read_dir(layout.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') {
                names.push(format!("{dir}/{name}"));
            }
        }
    }
    names.sort();
    names
}

/// Starts `cmd`, waits until `point` holds, and kills it with SIGKILL. Fails the test when
/// the process ends first: the kill point was never reached.
fn kill_when(cmd: &mut Command, what: &str, point: impl Fn() -> bool) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("gpubake starts");
    let start = Instant::now();
    loop {
        if point() {
            child.kill().unwrap();
            let status = child.wait().unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "{what}: {status}");
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{what}: the process ended ({status}) before the kill point");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "{what}: never reached"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A temporary file (hidden, of any release's naming) of at least 1 MiB in `dir`: an
/// archive being written.
fn writing_a_file_in(dir: PathBuf) -> impl Fn() -> bool {
    move || {
        std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().starts_with('.')
                    && e.metadata()
                        .is_ok_and(|m| m.is_file() && m.len() >= 1 << 20)
            })
    }
}

/// A blob of at least 1 MiB being written into the layout at `layout` (beside its index, or
/// where earlier releases wrote it, among the blobs): a layer or a download under way.
fn writing_a_blob_in(layout: PathBuf) -> impl Fn() -> bool {
    let (root, blobs) = (
        writing_a_file_in(layout.clone()),
        writing_a_file_in(layout.join("blobs/sha256")),
    );
    move || root() || blobs()
}

/// Runs `cmd` under strace, which kills it with SIGKILL when it renames a file over `target`
/// (which must exist: strace matches paths that resolve).
fn kill_at_rename_over(target: &Path, cmd: &Command) {
    let status = Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "-P"])
        .arg(target)
        .args(["-e", "trace=rename,renameat,renameat2"])
        .args(["-e", "inject=rename,renameat,renameat2:signal=KILL"])
        .arg("--")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .envs(cmd.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env_remove("GPUBAKE_PRESET_PATH")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    // strace ends as its tracee did.
    assert!(
        status.signal() == Some(9) || status.code() == Some(137),
        "not killed at the rename over {}: {status}",
        target.display()
    );
}

/// A recipe of the image the crashes build (without its Python stack), with `extra` lines.
fn recipe(extra: &str) -> String {
    format!("name: crash\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\n{extra}")
}

fn strace_works() -> bool {
    common::have("strace", "-V")
}

/// The recipe every crash builds: a files layer of 48 MiB that does not compress, so that
/// writing, uploading and downloading it takes long enough to be caught at.
struct Fixture {
    dir: tempfile::TempDir,
    recipe: String,
    /// The manifest of an uninterrupted build into a layout, and the cache it leaves.
    digest: String,
    cache_after: Vec<String>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    common::noise(&dir.path().join("noise.bin"), 48, 0x5eed);
    let recipe = write(
        dir.path(),
        "crash.yaml",
        &recipe("files: [{src: noise.bin, dest: /data/noise.bin}]\n"),
    );
    let cache = dir.path().join("reference-cache");
    let to = format!("oci:{}:v1", dir.path().join("reference").display());
    let json = ok(&mut gpubake(
        &cache,
        &common::build_args(&recipe, &from_base(), &to, &["--json"]),
    ));
    Fixture {
        digest: manifest(&json),
        cache_after: cache_entries(&cache),
        recipe,
        dir,
    }
}

impl Fixture {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `build` of the recipe into `to` with the cache at `cache`.
    fn build(&self, cache: &Path, to: &str, extra: &[&str]) -> Command {
        let from = from_base();
        let mut args = common::build_args(&self.recipe, &from, to, &["--json"]);
        args.extend(extra);
        gpubake(cache, &args)
    }

    /// What must hold after a crash and a rerun: no temporary file in `places` or the cache,
    /// and the cache's entries (records and blobs) those `reference`, an uninterrupted run
    /// of the same command, left in its own.
    fn clean(&self, cache: &Path, places: &[&Path], reference: &Path) {
        no_temp_files(places);
        no_temp_files(&[cache]);
        assert_eq!(
            cache_entries(cache),
            cache_entries(reference),
            "the cache's entries"
        );
    }
}

#[test]
fn a_build_into_a_layout_killed_while_it_writes_a_layer_leaves_nothing_once_run_again() {
    if !common::tools() {
        return;
    }
    let f = fixture();
    let (out, cache) = (f.path("out"), f.path("cache"));
    let to = format!("oci:{}:v1", out.display());
    kill_when(
        &mut f.build(&cache, &to, &[]),
        "a layer write",
        writing_a_blob_in(out.clone()),
    );
    assert_ne!(
        temp_files(&out),
        Vec::<PathBuf>::new(),
        "the kill left no partial blob"
    );
    let index = std::fs::read_to_string(out.join("index.json")).unwrap_or_default();
    assert!(
        !index.contains("\"v1\""),
        "a killed build tagged its image: {index}"
    );

    let json = ok(&mut f.build(&cache, &to, &[]));
    assert_eq!(manifest(&json), f.digest);
    ok(&mut gpubake(&cache, &["verify", &to]));
    f.clean(&cache, &[&out], &f.path("reference-cache"));
}

#[test]
fn a_build_killed_as_it_replaces_the_index_keeps_the_old_one_and_leaves_nothing_once_run_again() {
    if !common::tools() || !strace_works() {
        return;
    }
    let f = fixture();
    let (out, cache) = (f.path("out"), f.path("cache"));
    // The layout already holds an image, as a CI runner's output folder does.
    let small = write(f.dir.path(), "small.yaml", &recipe(""));
    let v0 = format!("oci:{}:v0", out.display());
    ok(&mut gpubake(
        &cache,
        &common::build_args(&small, &from_base(), &v0, &[]),
    ));
    let index_before = std::fs::read(out.join("index.json")).unwrap();

    let to = format!("oci:{}:v1", out.display());
    kill_at_rename_over(&out.join("index.json"), &f.build(&cache, &to, &[]));
    assert_eq!(std::fs::read(out.join("index.json")).unwrap(), index_before);
    assert_ne!(
        temp_files(&out),
        Vec::<PathBuf>::new(),
        "the kill left no new index"
    );
    ok(&mut gpubake(&cache, &["verify", &v0]));

    let json = ok(&mut f.build(&cache, &to, &[]));
    assert_eq!(manifest(&json), f.digest);
    ok(&mut gpubake(&cache, &["verify", &to]));
    ok(&mut gpubake(&cache, &["verify", &v0]));
    no_temp_files(&[&out, &cache]);
}

#[test]
fn a_build_into_an_archive_killed_while_it_writes_leaves_nothing_beside_it_once_run_again() {
    if !common::tools() {
        return;
    }
    let f = fixture();
    let (folder, cache) = (f.path("archives"), f.path("cache"));
    std::fs::create_dir_all(&folder).unwrap();
    let archive = folder.join("crash.tar");
    let to = format!("docker-archive:{}:crash:v1", archive.display());
    kill_when(
        &mut f.build(&cache, &to, &[]),
        "an archive write",
        writing_a_file_in(folder.clone()),
    );
    assert!(!archive.exists(), "a killed write left the archive's name");
    assert_ne!(
        temp_files(&folder),
        Vec::<PathBuf>::new(),
        "the kill left no partial archive"
    );

    let json = ok(&mut f.build(&cache, &to, &[]));
    assert_eq!(manifest(&json), f.digest);
    ok(&mut gpubake(
        &cache,
        &["verify", &format!("docker-archive:{}", archive.display())],
    ));
    let listing: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listing, ["crash.tar"]);
    let reference = f.path("reference-archive-cache");
    let elsewhere = format!(
        "docker-archive:{}:crash:v1",
        f.path("reference.tar").display()
    );
    ok(&mut f.build(&reference, &elsewhere, &[]));
    f.clean(&cache, &[&folder], &reference);
}

/// The bytes a registry holds in unfinished uploads.
fn uploading(registry: PathBuf) -> impl Fn() -> bool {
    move || {
        let mut dirs = vec![registry.clone()];
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(path);
                } else if path.components().any(|c| c.as_os_str() == "_uploads")
                    && e.metadata().is_ok_and(|m| m.len() >= 1 << 20)
                {
                    return true;
                }
            }
        }
        false
    }
}

#[test]
fn a_push_and_a_pull_killed_midway_leave_nothing_once_run_again() {
    if !common::tools() || !common::have("docker-registry", "--version") {
        return;
    }
    let f = fixture();
    let reg = local_registry(f.dir.path());
    let cache = f.path("cache");
    let remote = format!("docker://{}/crash:v1", reg.1);

    // A build to the registry, killed while it uploads the layer.
    kill_when(
        &mut f.build(&cache, &remote, &["--tls-verify=false"]),
        "an upload",
        uploading(f.path("registry")),
    );
    let json = ok(&mut f.build(&cache, &remote, &["--tls-verify=false"]));
    assert_eq!(manifest(&json), f.digest);
    // The registry's bytes, read afresh.
    ok(&mut gpubake(
        &cache,
        &["verify", &remote, "--tls-verify=false"],
    ));
    let reference = f.path("reference-push-cache");
    let elsewhere = format!("docker://{}/reference:v1", reg.1);
    ok(&mut f.build(&reference, &elsewhere, &["--tls-verify=false"]));
    f.clean(&cache, &[], &reference);

    // `copy` of the reference layout to another repository, killed while it uploads: the
    // copy run again lands the same manifest, byte for byte.
    let copied = format!("docker://{}/copied:v1", reg.1);
    let from = format!("oci:{}:v1", f.path("reference").display());
    let push = || {
        gpubake(
            &cache,
            &["copy", &from, &copied, "--tls-verify=false", "--json"],
        )
    };
    // Only this repository's uploads: the killed build's partial upload is still there.
    let repository = f.path("registry/docker/registry/v2/repositories/copied");
    kill_when(&mut push(), "a copy's upload", uploading(repository));
    assert_eq!(manifest(&ok(&mut push())), f.digest);
    ok(&mut gpubake(
        &cache,
        &["verify", &copied, "--tls-verify=false"],
    ));
    no_temp_files(&[&f.path("reference"), &cache]);

    // A pull into a layout, killed while it downloads the layer.
    let pulled = f.path("pulled");
    let to = format!("oci:{}:v1", pulled.display());
    let pull = || {
        let mut cmd = gpubake(
            &cache,
            &["copy", &remote, &to, "--tls-verify=false", "--json"],
        );
        cmd.env("GPUBAKE_CACHE_DIR", f.path("pull-cache"));
        cmd
    };
    let (blobs, cached) = (pulled.clone(), f.path("pull-cache/layout"));
    kill_when(&mut pull(), "a download", move || {
        writing_a_blob_in(blobs.clone())() || writing_a_blob_in(cached.clone())()
    });
    let json = ok(&mut pull());
    assert_eq!(manifest(&json), f.digest);
    ok(&mut gpubake(&cache, &["verify", &to]));
    no_temp_files(&[&pulled, &f.path("pull-cache")]);
}

/// The config digest of the image a layout's tag names: the image ID an engine gives it.
fn config_of(layout: &Path) -> String {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let blob = |digest: &str| layout.join("blobs/sha256").join(&digest["sha256:".len()..]);
    let manifest = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blob(manifest)).unwrap()).unwrap();
    manifest["config"]["digest"].as_str().unwrap().to_string()
}

#[test]
fn a_build_into_the_engine_killed_while_it_writes_a_layer_leaves_nothing_once_run_again() {
    if !common::tools() || !common::have("docker", "version") {
        return;
    }
    let f = fixture();
    let cache = f.path("cache");
    let name = format!("gpubake-crash-{}:v1", std::process::id());
    let to = format!("docker-daemon:{name}");
    // Into the engine, the cache's layout is where the layers are written.
    kill_when(
        &mut f.build(&cache, &to, &[]),
        "a layer write into the engine",
        writing_a_blob_in(cache.join("layout")),
    );
    ok(&mut f.build(&cache, &to, &[]));
    let id = ok(Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", &name]));
    let _ = Command::new("docker").args(["rmi", &name]).output();
    assert_eq!(id.trim(), config_of(&f.path("reference")));
    let reference = f.path("reference-engine-cache");
    let other = format!(
        "docker-daemon:gpubake-crash-{}:reference",
        std::process::id()
    );
    ok(&mut f.build(&reference, &other, &[]));
    let _ = Command::new("docker")
        .args(["rmi", &other["docker-daemon:".len()..]])
        .output();
    f.clean(&cache, &[], &reference);
}

#[test]
fn two_builds_writing_one_layout_and_one_cache_at_once_keep_both_images() {
    if !common::tools() {
        return;
    }
    let f = fixture();
    let (out, cache) = (f.path("out"), f.path("cache"));
    let other = write(f.dir.path(), "other.yaml", &recipe("env: {OTHER: '1'}\n"));
    let (first, second) = (
        format!("oci:{}:one", out.display()),
        format!("oci:{}:two", out.display()),
    );
    let one = f
        .build(&cache, &first, &[])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let two = gpubake(
        &cache,
        &common::build_args(&other, &from_base(), &second, &[]),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let (one, two) = (
        one.wait_with_output().unwrap(),
        two.wait_with_output().unwrap(),
    );
    assert!(
        one.status.success() && two.status.success(),
        "{}",
        String::from_utf8_lossy(&two.stderr)
    );
    assert_eq!(manifest(&String::from_utf8_lossy(&one.stdout)), f.digest);
    ok(&mut gpubake(&cache, &["verify", &first]));
    ok(&mut gpubake(&cache, &["verify", &second]));
    no_temp_files(&[&out, &cache]);
}

/// The blob files of a layout, by name.
fn blobs(layout: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

fn gc_json(cache: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["gc", "--json"];
    all.extend(args);
    serde_json::from_str(&ok(&mut gpubake(cache, &all))).unwrap()
}

fn kinds(report: &serde_json::Value) -> Vec<String> {
    let mut kinds: Vec<String> = report["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap().to_string())
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

#[test]
fn gc_removes_what_crashes_and_retags_left_in_a_layout_and_keeps_what_umoci_keeps() {
    if !common::tools() {
        return;
    }
    let f = fixture();
    let (out, cache) = (f.path("out"), f.path("cache"));
    let tag = format!("oci:{}:v0", out.display());
    let small = write(f.dir.path(), "small.yaml", &recipe(""));
    let other = write(f.dir.path(), "other.yaml", &recipe("env: {OTHER: '1'}\n"));
    // Uncompressed: its layers' blobs have the diff IDs of the next image's layers for
    // digests, which its config lists and which are not references to them.
    ok(&mut gpubake(
        &cache,
        &common::build_args(
            &small,
            &from_base(),
            &tag,
            &["--compression", "uncompressed"],
        ),
    ));
    // The tag moves to another image: the first one's manifest and config are unreferenced.
    ok(&mut gpubake(
        &cache,
        &common::build_args(&other, &from_base(), &tag, &[]),
    ));
    // A build killed mid-layer leaves its partial blob.
    let killed = format!("oci:{}:v1", out.display());
    kill_when(
        &mut f.build(&cache, &killed, &[]),
        "a layer write",
        writing_a_blob_in(out.clone()),
    );
    let temps = temp_files(&out);
    assert_eq!(temps.len(), 1, "{temps:?}");

    // umoci's answer, on a copy.
    let umoci_copy = f.path("umoci");
    assert!(
        Command::new("cp")
            .arg("-a")
            .arg(&out)
            .arg(&umoci_copy)
            .status()
            .unwrap()
            .success()
    );
    assert!(
        Command::new("umoci")
            .args(["gc", "--layout"])
            .arg(&umoci_copy)
            .status()
            .unwrap()
            .success()
    );

    let before = blobs(&out);
    let dry = gc_json(&cache, &["--dry-run", &format!("oci:{}", out.display())]);
    assert_eq!(blobs(&out), before, "a dry run removed blobs");
    assert_eq!(
        temp_files(&out),
        temps,
        "a dry run removed the partial blob"
    );
    // The first image's own layer goes, and so does the layout's record of it.
    assert_eq!(
        kinds(&dry),
        ["record", "temporary file", "unreferenced blob"],
        "{dry}"
    );

    let done = gc_json(&cache, &[&format!("oci:{}", out.display())]);
    assert_eq!(done["removed"], dry["removed"]);
    assert_eq!(temp_files(&out), Vec::<PathBuf>::new());
    assert_eq!(
        blobs(&out),
        blobs(&umoci_copy),
        "gc and umoci gc keep different blobs"
    );
    assert!(blobs(&out).len() < before.len());
    ok(&mut gpubake(&cache, &["verify", &tag]));
    assert!(
        Command::new("skopeo")
            .args(["inspect", &tag])
            .output()
            .unwrap()
            .status
            .success()
    );
    // No record of the layout names a blob that went.
    for record in std::fs::read_dir(out.join(".gpubake/layers")).unwrap() {
        let text = std::fs::read_to_string(record.unwrap().path()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let digest = v["descriptor"]["digest"].as_str().unwrap();
        assert!(
            out.join("blobs/sha256")
                .join(&digest["sha256:".len()..])
                .exists(),
            "{text}"
        );
    }
    // A second gc finds nothing.
    let again = gc_json(&cache, &[&format!("oci:{}", out.display())]);
    assert_eq!(again["removed"], serde_json::json!([]));

    // What a damaged layout stops gc at, removing nothing: not even a blob that is garbage
    // by any reading, since what the damaged document names cannot be known.
    let junk = b"a blob nothing names";
    let junk_hex = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(junk));
    std::fs::write(out.join("blobs/sha256").join(&junk_hex), junk).unwrap();
    let index_path = out.join("index.json");
    let index_bytes = std::fs::read(&index_path).unwrap();
    let index: serde_json::Value = serde_json::from_slice(&index_bytes).unwrap();
    let top = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let top_path = out.join("blobs/sha256").join(&top["sha256:".len()..]);
    let original = std::fs::read(&top_path).unwrap();
    let mut flipped = original.clone();
    flipped[original.len() / 2] ^= 0x01;
    let before = blobs(&out);
    let gc_fails = |what: &str, names: &str, expect: &[String]| {
        let failed = run(&mut gpubake(
            &cache,
            &["gc", &format!("oci:{}", out.display())],
        ));
        let stderr = String::from_utf8_lossy(&failed.stderr);
        assert_eq!(failed.status.code(), Some(2), "{what}: {stderr}");
        assert!(stderr.contains(names), "{what}: {stderr}");
        assert!(
            stderr.contains("removed nothing") || stderr.contains("reading"),
            "{what}: {stderr}"
        );
        assert_eq!(blobs(&out), expect, "{what}: gc removed blobs");
    };
    // The manifest index.json names: a byte changed, the same size of zeros (not JSON, and
    // no size to tell), one byte fewer (a size its descriptor does not give).
    let damages = [
        ("a byte changed", flipped),
        ("zeros of its size", vec![0u8; original.len()]),
        ("one byte fewer", original[..original.len() - 1].to_vec()),
    ];
    for (what, bytes) in damages {
        std::fs::write(&top_path, &bytes).unwrap();
        gc_fails(what, &top, &before);
    }
    std::fs::remove_file(&top_path).unwrap();
    let without_top: Vec<String> = before
        .iter()
        .filter(|b| !top.ends_with(b.as_str()))
        .cloned()
        .collect();
    gc_fails("manifest missing", &top, &without_top);
    std::fs::write(&top_path, &original).unwrap();
    // index.json missing, empty, cut short.
    std::fs::remove_file(&index_path).unwrap();
    gc_fails("index.json missing", "index.json", &before);
    for (what, bytes) in [
        ("index.json empty", &index_bytes[..0]),
        (
            "index.json cut short",
            &index_bytes[..index_bytes.len() / 2],
        ),
    ] {
        std::fs::write(&index_path, bytes).unwrap();
        gc_fails(what, "index.json", &before);
    }
    std::fs::write(&index_path, &index_bytes).unwrap();
    ok(&mut gpubake(&cache, &["verify", &tag]));
    // Sound again, the layout gives up its garbage.
    let done = gc_json(&cache, &[&format!("oci:{}", out.display())]);
    assert_eq!(kinds(&done), ["unreferenced blob"], "{done}");
    assert!(!out.join("blobs/sha256").join(&junk_hex).exists());
}

#[test]
fn gc_waits_for_a_live_build_and_removes_nothing_it_writes() {
    if !common::tools() {
        return;
    }
    let f = fixture();
    let (out, cache) = (f.path("out"), f.path("cache"));
    let to = format!("oci:{}:v1", out.display());
    let build = f
        .build(&cache, &to, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let writing = writing_a_blob_in(out.clone());
    let start = Instant::now();
    while !writing() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the build never wrote its layer"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Both gcs start while the build writes its layer; each waits for it.
    let gc = |args: &[&str]| {
        gpubake(&cache, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let layout_gc = gc(&["gc", &format!("oci:{}", out.display())]);
    let cache_gc = gc(&["gc", "--cache"]);
    let built = build.wait_with_output().unwrap();
    let (layout_gc, cache_gc) = (
        layout_gc.wait_with_output().unwrap(),
        cache_gc.wait_with_output().unwrap(),
    );
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert_eq!(manifest(&String::from_utf8_lossy(&built.stdout)), f.digest);
    for gc in [&layout_gc, &cache_gc] {
        assert!(
            gc.status.success(),
            "{}",
            String::from_utf8_lossy(&gc.stderr)
        );
        assert!(
            String::from_utf8_lossy(&gc.stderr).contains("waiting"),
            "{}",
            String::from_utf8_lossy(&gc.stderr)
        );
    }
    ok(&mut gpubake(&cache, &["verify", &to]));
    assert_eq!(
        cache_entries(&cache),
        f.cache_after,
        "gc took the live build's cache entries"
    );
}

#[test]
fn gc_of_the_cache_removes_leftovers_and_orphans_and_keeps_every_recorded_layer() {
    if !common::tools() {
        return;
    }
    let f = fixture();
    let cache = f.path("cache");
    let to = format!("oci:{}:v1", f.path("out").display());
    ok(&mut f.build(&cache, &to, &[]));
    let kept = cache_entries(&cache);
    // What killed processes leave in a cache: a partial blob, an interrupted download with
    // its lock free, and a blob shared before its record was written.
    let blobs_dir = cache.join("layout/blobs/sha256");
    std::fs::write(blobs_dir.join(".gpubake-tmp-abcdefghijkl"), vec![0u8; 4096]).unwrap();
    let fan = cache.join("wheels/sha256/ab");
    std::fs::create_dir_all(&fan).unwrap();
    let sha = "ab".repeat(32);
    std::fs::write(fan.join(format!("{sha}.part")), b"half a wheel").unwrap();
    std::fs::write(fan.join(format!("{sha}.lock")), b"").unwrap();
    let orphan = b"a layer nobody recorded";
    let digest = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(orphan))
    };
    std::fs::write(blobs_dir.join(&digest), orphan).unwrap();
    // A small blob changed in place: garbage in a cache, which writes it again.
    let damaged = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(b"{\"what\": \"a config\"}"))
    };
    std::fs::write(blobs_dir.join(&damaged), b"{\"what\": \"changed!\"}").unwrap();

    let dry = gc_json(&cache, &["--cache", "--dry-run"]);
    assert_eq!(dry["removed"].as_array().unwrap().len(), 4, "{dry}");
    assert_eq!(
        kinds(&dry),
        [
            "damaged blob",
            "interrupted download",
            "temporary file",
            "unreferenced blob"
        ]
    );
    assert!(blobs_dir.join(&digest).exists());
    let done = gc_json(&cache, &["--cache"]);
    assert_eq!(done["removed"], dry["removed"]);
    assert_eq!(cache_entries(&cache), kept, "gc took a recorded layer");
    assert!(!blobs_dir.join(&digest).exists() && !fan.join(format!("{sha}.part")).exists());
    assert!(!blobs_dir.join(&damaged).exists());
    assert_eq!(temp_files(&cache), Vec::<PathBuf>::new());
    // A cache that is not there is named, with the OS's words.
    let missing = run(&mut gpubake(&f.path("no-cache"), &["gc", "--cache"]));
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no-cache: No such file or directory"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    // The cache still builds the image without writing a layer again.
    let again = f.path("again");
    let json = ok(&mut f.build(&cache, &format!("oci:{}:v1", again.display()), &[]));
    assert_eq!(manifest(&json), f.digest);
}

/// A TCP proxy in front of a registry that kills the process whose pid is in `victim` with
/// SIGKILL when a request whose head holds `trigger` comes through, before the registry
/// sees it: a kill at an exact step of an HTTP exchange.
struct KillingProxy {
    addr: String,
    victim: std::sync::Arc<std::sync::atomic::AtomicI32>,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn killing_proxy(upstream: &str, trigger: &'static str) -> KillingProxy {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let victim = Arc::new(AtomicI32::new(0));
    let fired = Arc::new(AtomicBool::new(false));
    let (pid, hit, upstream) = (victim.clone(), fired.clone(), upstream.to_string());
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let (pid, hit, upstream) = (pid.clone(), hit.clone(), upstream.clone());
            std::thread::spawn(move || {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    return;
                };
                let (mut from_client, mut to_server) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (mut from_server, mut to_client) = (server, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_server, &mut to_client);
                    let _ = to_client.shutdown(Shutdown::Both);
                });
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n @ 1..) = from_client.read(&mut buf) {
                    let seen = &buf[..n];
                    if seen.windows(trigger.len()).any(|w| w == trigger.as_bytes())
                        && !hit.swap(true, Ordering::SeqCst)
                    {
                        let victim = pid.load(Ordering::SeqCst);
                        assert!(victim > 0, "the proxy fired before its victim was named");
                        // SAFETY: kill(2) takes no pointers; the pid is the test's child.
                        unsafe { libc::kill(victim, libc::SIGKILL) };
                        break;
                    }
                    if to_server.write_all(seen).is_err() {
                        break;
                    }
                }
                let _ = to_server.shutdown(Shutdown::Both);
            });
        }
    });
    KillingProxy {
        addr,
        victim,
        fired,
    }
}

/// The referrers a registry's tag schema lists for the image `name:tag` behind `addr`.
fn referrers(cache: &Path, image: &str) -> Vec<serde_json::Value> {
    let json = ok(&mut gpubake(
        cache,
        &["inspect", image, "--tls-verify=false", "--json"],
    ));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["referrers"].as_array().cloned().unwrap_or_default()
}

#[test]
fn certify_attach_killed_at_each_write_of_the_referrer_attaches_one_certificate_when_run_again() {
    if !common::tools() || !common::have("docker-registry", "--version") {
        return;
    }
    let f = fixture();
    let reg = local_registry(f.dir.path());
    let cache = f.path("cache");
    let direct = format!("docker://{}/crash:v1", reg.1);
    ok(&mut f.build(&cache, &direct, &["--tls-verify=false"]));
    ok(gpubake(&cache, &["key", "generate", "--output-prefix"])
        .arg(f.path("cosign"))
        .stdin(Stdio::null()));
    let key = f.path("cosign.key").display().to_string();
    let public = f.path("cosign.pub").display().to_string();
    // The scratch folders certify unpacks the image into go under this TMPDIR.
    let scratch = f.path("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let certify = |image: &str| {
        let mut cmd = gpubake(
            &cache,
            &[
                "certify",
                image,
                "--gpus",
                "none",
                "--attach",
                "--key",
                &key,
                "--tls-verify=false",
            ],
        );
        cmd.env("TMPDIR", &scratch);
        cmd
    };
    // The artifact's manifest (pushed by digest), then the referrers index (tag sha256-HEX).
    for (step, trigger) in [
        ("the artifact's manifest", "PUT /v2/crash/manifests/sha256:"),
        ("the referrers index", "PUT /v2/crash/manifests/sha256-"),
    ] {
        let proxy = killing_proxy(&reg.1, trigger);
        let through = format!("docker://{}/crash:v1", proxy.addr);
        let mut child = certify(&through)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        proxy
            .victim
            .store(child.id() as i32, std::sync::atomic::Ordering::SeqCst);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert!(
            proxy.fired.load(std::sync::atomic::Ordering::SeqCst) && status.signal() == Some(9),
            "{step}: not killed there ({status})"
        );
        // No certificate is listed for the image: a referrer is whole or absent.
        let before = referrers(&cache, &direct).len();
        ok(&mut certify(&direct));
        let after = referrers(&cache, &direct);
        assert_eq!(after.len(), before + 1, "{step}: {after:?}");
        ok(&mut gpubake(
            &cache,
            &[
                "verify",
                &direct,
                "--certified",
                "--static-ok",
                "--key",
                &public,
                "--tls-verify=false",
            ],
        ));
    }
    let left: Vec<_> = std::fs::read_dir(&scratch)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "certify left in its TMPDIR: {left:?}");
    no_temp_files(&[&cache]);
}
