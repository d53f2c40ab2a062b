//! `cargo bench --bench compress`: gpubake's layer writer against the usual tools doing the
//! same work, in one run, runs alternated so a machine that speeds up or slows down mid-run
//! moves both sides alike.
//!
//! The content is a generated tree under `target/bench-compress/tree` (1 GiB of random bytes
//! from a seeded generator, 1 GiB of log-like text, and a thousand small files), made once.
//! Each side turns the whole tree into one compressed layer blob:
//!
//! - gzip: `gpubake::image::layer::build_layer` (cache off) against `umoci insert` into a
//!   layout made by `umoci init` + `umoci new`. Both hash the tar (diff ID) and the blob.
//! - zstd: the same writer against `tar -cf - DIR | zstd -3 -T<cores> > out`, which hashes
//!   nothing: the yardstick is the compressor itself.
//!
//! Printed: median wall seconds, throughput on the uncompressed bytes, the median of the
//! per-pair ratios to the peer, CPU seconds (user + system, this process's own for gpubake
//! and the waited-for children's for the peer), and blob sizes. `GPUBAKE_BENCH_RUNS` sets the
//! number of runs of each side (default 3), `GPUBAKE_BENCH_ONLY=NAME` runs one (gzip, zstd,
//! estargz, zstd:chunked, uncompressed: against `tar > file`), and `GPUBAKE_BENCH_ONE=gzip|zstd`
//! writes one gpubake layer, prints its time and exits.
//!
//! Needs umoci, tar and zstd on PATH.

use gpubake::image::layer::{Compression, LayerSpec, build_layer, tree_entries};
use gpubake::image::layout::Layout;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Random bytes, then text, each this much.
const HALF: u64 = 1 << 30;
/// Size of each generated file of either kind.
const FILE: u64 = 32 << 20;

/// xorshift64: reproducible bytes without a dependency; its output does not compress.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Writes the tree once; a marker file says it is complete, so an interrupted run starts over.
fn generate(dir: &Path) {
    let marker = dir.join(".complete-v1");
    if marker.exists() {
        return;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("random")).unwrap();
    std::fs::create_dir_all(dir.join("text")).unwrap();
    std::fs::create_dir_all(dir.join("small")).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..HALF / FILE {
        let mut buf = Vec::with_capacity(FILE as usize);
        while (buf.len() as u64) < FILE {
            buf.extend_from_slice(&rng.next().to_le_bytes());
        }
        std::fs::write(dir.join(format!("random/r{i:03}.bin")), &buf).unwrap();
    }
    // Training-log-like lines: repeated words, changing numbers; gzip -1 makes about a third
    // of it, like source trees and logs in real images.
    for i in 0..HALF / FILE {
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(dir.join(format!("text/t{i:03}.log"))).unwrap(),
        );
        let mut written = 0u64;
        let mut step = 0u64;
        while written < FILE {
            step += 1;
            let line = format!(
                "epoch {} step {step} loss {:.5} lr {:.2e} grad_norm {:.3} tokens/s {}\n",
                i,
                (rng.next() % 200_000) as f64 / 1e5,
                3e-4 * (1.0 - step as f64 / 1e6),
                (rng.next() % 5000) as f64 / 1e3,
                40_000 + rng.next() % 9000
            );
            let take = line.len().min((FILE - written) as usize);
            out.write_all(&line.as_bytes()[..take]).unwrap();
            written += take as u64;
        }
        out.flush().unwrap();
    }
    for i in 0..1000u32 {
        let body = format!("# module {i}\nimport torch\n\ndef f{i}(x):\n    return x * {i}\n");
        std::fs::write(dir.join(format!("small/m{i:04}.py")), body.repeat(40)).unwrap();
    }
    std::fs::write(marker, b"").unwrap();
}

/// CPU seconds (user + system) of this process and of its waited-for children, from
/// /proc/self/stat (clock ticks of 1/100 s on Linux).
fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<f64> = rest.split(' ').map(|s| s.parse().unwrap_or(0.0)).collect();
    // utime, stime, cutime, cstime are fields 14-17; `rest` starts at field 3.
    ((f[11] + f[12]) / 100.0, (f[13] + f[14]) / 100.0)
}

/// One timed run: wall seconds, CPU seconds, blob bytes.
struct Run {
    wall: f64,
    cpu: f64,
    size: u64,
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn gpubake(tree: &Path, work: &Path, compression: Compression) -> Run {
    let dir = work.join("gpubake");
    let _ = std::fs::remove_dir_all(&dir);
    let layout = Layout::create(&dir).unwrap();
    let spec = LayerSpec {
        name: "bench".into(),
        created_by: "bench".into(),
        entries: tree_entries(tree, "/workspace", None).unwrap(),
        prefetch: None,
    };
    let (cpu0, _) = cpu_seconds();
    let start = Instant::now();
    let built = build_layer(&layout, &spec, compression, 0, false).unwrap();
    let wall = start.elapsed().as_secs_f64();
    let (cpu1, _) = cpu_seconds();
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        wall,
        cpu: cpu1 - cpu0,
        size: built.descriptor.size(),
    }
}

/// `umoci insert` of the tree into a fresh image; the size is that of its new layer blob.
fn umoci(tree: &Path, work: &Path) -> Run {
    let dir = work.join("umoci");
    let _ = std::fs::remove_dir_all(&dir);
    run_ok(Command::new("umoci").arg("init").arg("--layout").arg(&dir));
    let image = format!("{}:bench", dir.display());
    run_ok(Command::new("umoci").args(["new", "--image", &image]));
    let (_, cpu0) = cpu_seconds();
    let start = Instant::now();
    run_ok(
        Command::new("umoci")
            .args(["insert", "--image", &image])
            .arg(tree)
            .arg("/workspace"),
    );
    let wall = start.elapsed().as_secs_f64();
    let (_, cpu1) = cpu_seconds();
    let size = largest_blob(&dir.join("blobs/sha256"));
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        wall,
        cpu: cpu1 - cpu0,
        size,
    }
}

/// The new layer is the only large blob in a layout made by `umoci new` + one insert.
fn largest_blob(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .max()
        .unwrap_or(0)
}

fn zstd_cli(tree: &Path, work: &Path, threads: usize) -> Run {
    tar_cli(tree, work, &format!("zstd -q -3 -T{threads}"))
}

/// `tar` of the tree through `filter` into a file: `cat` for an uncompressed layer's peer
/// (which, unlike gpubake, hashes nothing).
fn tar_cli(tree: &Path, work: &Path, filter: &str) -> Run {
    let out = work.join("cli.tar.out");
    let script = format!(
        "tar -C '{}' -cf - . | {filter} > '{}'",
        tree.display(),
        out.display()
    );
    let (_, cpu0) = cpu_seconds();
    let start = Instant::now();
    run_ok(Command::new("sh").arg("-c").arg(&script));
    let wall = start.elapsed().as_secs_f64();
    let (_, cpu1) = cpu_seconds();
    let size = std::fs::metadata(&out).unwrap().len();
    let _ = std::fs::remove_file(&out);
    Run {
        wall,
        cpu: cpu1 - cpu0,
        size,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn tree_bytes(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file())
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let work = root.join("target/bench-compress");
    let tree = work.join("tree");
    let t = Instant::now();
    generate(&tree);
    let bytes = tree_bytes(&tree);
    eprintln!(
        "content ready in {:.1} s: {} ({:.2} GB)",
        t.elapsed().as_secs_f64(),
        tree.display(),
        bytes as f64 / 1e9
    );
    // One layer and nothing else, for timing from outside (`/usr/bin/time`, or against
    // another build of this bench).
    if let Ok(one) = std::env::var("GPUBAKE_BENCH_ONE") {
        let compression = match one.as_str() {
            "gzip" => Compression::Gzip,
            "zstd" => Compression::Zstd,
            "estargz" => Compression::Estargz,
            other => panic!("GPUBAKE_BENCH_ONE={other}: gzip, zstd or estargz"),
        };
        let run = gpubake(&tree, &work, compression);
        println!(
            "{one}: {:.2} s, {:.2} cpu s, {} bytes",
            run.wall, run.cpu, run.size
        );
        return;
    }
    let runs: usize = std::env::var("GPUBAKE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let only = std::env::var("GPUBAKE_BENCH_ONLY").ok();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);

    // Reads the tree once, so the first timed run does not pay for the page cache.
    let _ = tree_entries(&tree, "/w", None);
    run_ok(
        Command::new("sh")
            .arg("-c")
            .arg(format!("tar -C '{}' -cf - . > /dev/null", tree.display())),
    );

    let mut rows = Vec::new();
    for (name, compression) in [
        ("gzip", Compression::Gzip),
        ("zstd", Compression::Zstd),
        ("estargz", Compression::Estargz),
        ("zstd:chunked", Compression::ZstdChunked),
        ("uncompressed", Compression::Uncompressed),
    ] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let peer_name = match compression {
            Compression::Gzip => "umoci insert".to_string(),
            Compression::Zstd => format!("tar | zstd -3 -T{threads}"),
            // No peer writes eStargz from a directory; plain gzip is what its framing costs
            // against.
            Compression::Estargz => "umoci insert (plain gzip)".to_string(),
            // Nor zstd:chunked: against plain zstd.
            Compression::ZstdChunked => format!("tar | zstd -3 -T{threads} (plain zstd)"),
            Compression::Uncompressed => "tar > file".to_string(),
        };
        let mut ours = Vec::new();
        let mut peer = Vec::new();
        for i in 0..runs {
            // Alternate which side goes first, so neither always runs on a warmer machine.
            let pair = |ours: &mut Vec<Run>, peer: &mut Vec<Run>| {
                let p = || match compression {
                    Compression::Gzip | Compression::Estargz => umoci(&tree, &work),
                    Compression::Zstd | Compression::ZstdChunked => zstd_cli(&tree, &work, threads),
                    Compression::Uncompressed => tar_cli(&tree, &work, "cat"),
                };
                if i % 2 == 0 {
                    ours.push(gpubake(&tree, &work, compression));
                    peer.push(p());
                } else {
                    peer.push(p());
                    ours.push(gpubake(&tree, &work, compression));
                }
            };
            pair(&mut ours, &mut peer);
            eprintln!(
                "{name} run {}: gpubake {:.2} s, {peer_name} {:.2} s",
                i + 1,
                ours[i].wall,
                peer[i].wall
            );
        }
        rows.push((name, peer_name, ours, peer));
    }

    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "content: {:.2} GB in {} files; {threads} cores ({cpu_model}); median of {runs} runs",
        bytes as f64 / 1e9,
        walkdir::WalkDir::new(&tree)
            .into_iter()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_file())
            .count()
    );
    println!(
        "{:<6} {:<22} {:>8} {:>8} {:>9} {:>8} {:>12} {:>10}",
        "format", "writer", "seconds", "MB/s", "vs peer", "cpu s", "blob MB", "vs peer"
    );
    for (name, peer_name, ours, peer) in &rows {
        let ratio = median(
            ours.iter()
                .zip(peer)
                .map(|(o, p)| o.wall / p.wall)
                .collect(),
        );
        let line = |who: &str, runs: &[Run], ratio: Option<f64>, size_ratio: Option<f64>| {
            let wall = median(runs.iter().map(|r| r.wall).collect());
            let cpu = median(runs.iter().map(|r| r.cpu).collect());
            let size = median(runs.iter().map(|r| r.size as f64).collect());
            println!(
                "{:<6} {:<22} {:>8.2} {:>8.0} {:>9} {:>8.2} {:>12.1} {:>10}",
                name,
                who,
                wall,
                bytes as f64 / 1e6 / wall,
                ratio.map(|r| format!("{r:.2}x")).unwrap_or_default(),
                cpu,
                size / 1e6,
                size_ratio.map(|r| format!("{r:.3}x")).unwrap_or_default(),
            );
        };
        let size_ratio = ours[0].size as f64 / peer[0].size as f64;
        line("gpubake", ours, Some(ratio), Some(size_ratio));
        line(peer_name, peer, None, None);
    }
    println!("vs peer: median over pairs of gpubake's time (or size) divided by the peer's");
}
