//! Replays every fuzz seed (`fuzz/corpus/TARGET/`) and every input a fuzzer once crashed on
//! (`fuzz/regressions/TARGET/`) through the fuzz targets' bodies, so that `cargo test` holds
//! each past crash fixed without a fuzzing toolchain. `scripts/fuzz` does the fuzzing itself.

#[path = "../fuzz/src/lib.rs"]
mod fuzz_targets;

use std::path::Path;

/// A target's name and body.
type Target = (&'static str, fn(&[u8]));

const TARGETS: &[Target] = &[
    ("recipe", fuzz_targets::recipe),
    ("preset", fuzz_targets::preset),
    ("lock", fuzz_targets::lock),
    ("pylock", fuzz_targets::pylock),
    ("startup_record", fuzz_targets::startup_record),
    ("oci_image", fuzz_targets::oci_image),
    ("docker_archive", fuzz_targets::docker_archive),
    ("layer_tar", fuzz_targets::layer_tar),
    ("wheel", fuzz_targets::wheel),
    ("nvidia_require", fuzz_targets::nvidia_require),
    ("nccl_conf", fuzz_targets::nccl_conf),
    ("signed", fuzz_targets::signed),
    ("key", fuzz_targets::key),
];

/// One test, not one per target: the unpacking targets switch the process's effective user,
/// which would pull the rug from under tests running beside them in other threads.
#[test]
fn every_seed_and_every_past_crash_passes_its_target() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let targets: Vec<String> = std::fs::read_dir(fuzz.join("fuzz_targets"))
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for name in &targets {
        assert!(
            TARGETS.iter().any(|(t, _)| t == name),
            "fuzz target {name} is not replayed here"
        );
    }
    let mut replayed = 0;
    for (name, body) in TARGETS {
        let mut seeds = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(name)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                eprintln!("{}", path.display());
                body(&data);
                seeds += 1;
            }
        }
        assert!(seeds > 0, "fuzz/corpus/{name} holds no seed");
        replayed += seeds;
    }
    eprintln!("{replayed} inputs replayed");
}
