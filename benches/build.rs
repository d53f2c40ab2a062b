//! `cargo bench --bench build`: a daemonless gpubake build against `docker build` of the same
//! content, in one run. The content is a generated tree (default 2 GiB, GPUBAKE_BENCH_GIB to
//! change) of compressible and random files, added by the recipe's `files:`; Docker builds
//! `FROM` the same base (loaded into the engine first) with `COPY` of the same tree. Also
//! timed: gpubake's rebuild after a preset change, which should reuse every large layer.
//!
//! Needs umoci, skopeo, busybox-static and a Docker engine (scripts/test installs them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn run(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    start.elapsed()
}

/// Writes `bytes` of content: half in 32 MiB files of random bytes, half in text-like files
/// (repeated lines with changing numbers, like logs or source), plus a thousand 4 KiB files.
fn generate(dir: &Path, bytes: u64) {
    let marker = dir.join(format!(".complete-{bytes}"));
    if marker.exists() {
        return;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("small")).unwrap();
    let mut x: u64 = 0x2545f4914f6cdd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let chunk = 32u64 << 20;
    for i in 0..(bytes / 2 / chunk) {
        let mut buf = Vec::with_capacity(chunk as usize);
        while (buf.len() as u64) < chunk {
            buf.extend_from_slice(&next().to_le_bytes());
        }
        std::fs::write(dir.join(format!("random-{i:03}.bin")), &buf).unwrap();
        let mut text = Vec::with_capacity(chunk as usize);
        let mut n = 0u64;
        while (text.len() as u64) < chunk {
            n += 1;
            text.extend_from_slice(
                format!(
                    "step {n} loss {:.6} lr 3e-4 grad_norm {}\n",
                    (next() % 100_000) as f64 / 1e5,
                    next() % 97
                )
                .as_bytes(),
            );
        }
        text.truncate(chunk as usize);
        std::fs::write(dir.join(format!("log-{i:03}.txt")), &text).unwrap();
    }
    for i in 0..1000 {
        let body: Vec<u8> = (0..4096).map(|j| b"abcdefgh"[(i + j) % 8]).collect();
        std::fs::write(dir.join("small").join(format!("f{i:04}.py")), body).unwrap();
    }
    std::fs::write(marker, b"").unwrap();
}

fn main() {
    let gib: f64 = std::env::var("GPUBAKE_BENCH_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2.0);
    let bytes = (gib * (1u64 << 30) as f64) as u64;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let work = root.join("target/bench-build");
    std::fs::create_dir_all(&work).unwrap();
    let gpubake = env!("CARGO_BIN_EXE_gpubake");

    let tree = work.join("tree");
    let t = Instant::now();
    generate(&tree, bytes);
    eprintln!(
        "content ready in {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        tree.display()
    );

    let base = work.join("base");
    if !base.join("index.json").exists() {
        run(Command::new(root.join("scripts/make-test-base"))
            .arg(&base)
            .arg(gpubake));
    }
    let recipe = work.join("recipe.yaml");
    let write_recipe = |debug: &str| {
        std::fs::write(
            &recipe,
            format!(
                "name: bench\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base, nvlink]\n\
                 env:\n  NCCL_DEBUG: {debug}\nfiles:\n  - {{src: tree, dest: /workspace}}\n"
            ),
        )
        .unwrap();
    };

    let mut rows: Vec<(String, Duration)> = Vec::new();
    for compression in ["gzip", "zstd"] {
        let out = work.join(format!("out-{compression}"));
        let _ = std::fs::remove_dir_all(&out);
        let build = || {
            run(Command::new(gpubake)
                .arg("build")
                .arg("--without-python")
                .arg(&recipe)
                .arg("--from")
                .arg(format!("oci:{}:latest", base.display()))
                .arg("--to")
                .arg(format!("oci:{}:v1", out.display()))
                .args(["--compression", compression]))
        };
        write_recipe("WARN");
        rows.push((format!("gpubake build, first ({compression})"), build()));
        write_recipe("INFO");
        rows.push((
            format!("gpubake rebuild after a preset change ({compression})"),
            build(),
        ));
    }

    let tag = "gpubake-bench-base:latest";
    let archive = work.join("base.tar");
    let _ = std::fs::remove_file(&archive);
    run(Command::new("skopeo")
        .arg("copy")
        .arg(format!("oci:{}:latest", base.display()))
        .arg(format!("docker-archive:{}:{tag}", archive.display())));
    run(Command::new("docker").arg("load").arg("-i").arg(&archive));
    std::fs::write(
        work.join("Dockerfile"),
        format!("FROM {tag}\nCOPY tree /workspace\n"),
    )
    .unwrap();
    std::fs::write(work.join(".dockerignore"), "*\n!tree\n").unwrap();
    let _ = Command::new("docker")
        .args(["rmi", "-f", "gpubake-bench:docker"])
        .output();
    let _ = Command::new("docker")
        .args(["builder", "prune", "-af"])
        .output();
    let d = run(Command::new("docker")
        .args(["build", "-q", "-t", "gpubake-bench:docker"])
        .arg(&work)
        .env("DOCKER_BUILDKIT", "0"));
    rows.push(("docker build (legacy builder), first".into(), d));
    let _ = Command::new("docker")
        .args(["rmi", "-f", "gpubake-bench:docker", tag])
        .output();

    let docker = rows
        .iter()
        .find(|(n, _)| n.starts_with("docker"))
        .map(|(_, d)| *d)
        .unwrap();
    println!(
        "content: {:.2} GiB in {} ({} cores)",
        gib,
        tree.display(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!("{:<48} {:>10} {:>14}", "build", "seconds", "vs docker");
    for (name, d) in &rows {
        println!(
            "{:<48} {:>10.2} {:>13.2}x",
            name,
            d.as_secs_f64(),
            docker.as_secs_f64() / d.as_secs_f64()
        );
    }
    println!("vs docker: docker's time divided by this row's (above 1 means faster than docker)");
}
