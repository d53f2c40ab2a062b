//! The static link closure held to what glibc's ld.so did in a real training process on an
//! H200 (benches/h200-closure.sh, raw record benches/results/closure-h200-2026-12-02.json.gz):
//! the machine's torch 2.11 initialised CUDA, ran a GEMM, a cuDNN convolution and a one-rank
//! NCCL all-reduce under `LD_DEBUG=files,libs`, which logs every object ld.so loads, who asked
//! for it (DT_NEEDED or dlopen), each search step and each file it tried; the process then
//! listed /proc/self/maps. Beside it the record keeps the file tree ld.so searched, each file
//! as readelf printed it, and the machine's /etc/ld.so.cache.
//!
//! The static side gets only what a static view cannot know: the program, and the names the
//! process passed to dlopen (Python's imports, torch's ctypes preloads, libcudart's libcuda,
//! cuDNN's engines, NCCL's plugins) with the object that called it. Everything else (every
//! DT_NEEDED, which copy each name binds, the search step that finds it, each dlopen's
//! answer) is predicted from the tree by `gpubake::image::links` and compared with ld.so's
//! log, then the objects loaded with the mapped files.

use base64::Engine;
use gpubake::image::links::{ElfInfo, Entry, Linker, Search, Tree, Via, real_path};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

const RECORD: &str = "benches/results/closure-h200-2026-12-02.json.gz";

/// The recorded file tree. A path the record does not hold is absent when its directory was
/// listed whole (every directory, link and file with ".so" in its name); any other path is a
/// gap in the record, collected so the test can say the record does not cover the question.
struct Recorded {
    entries: BTreeMap<String, Value>,
    cache: Vec<u8>,
    gaps: RefCell<BTreeSet<String>>,
}

impl Recorded {
    fn load(record: &Value) -> Recorded {
        let mut entries: BTreeMap<String, Value> = record["entries"]
            .as_object()
            .expect("entries")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        entries.insert("/etc".into(), serde_json::json!({"kind": "dir"}));
        entries.insert(
            "/etc/ld.so.cache".into(),
            serde_json::json!({"kind": "file"}),
        );
        let cache = base64::engine::general_purpose::STANDARD
            .decode(record["ld_so_cache"].as_str().expect("ld_so_cache"))
            .expect("base64");
        Recorded {
            entries,
            cache,
            gaps: RefCell::new(BTreeSet::new()),
        }
    }
}

impl Tree for Recorded {
    fn entry(&self, path: &str) -> Entry {
        match self.entries.get(path) {
            Some(e) => match e["kind"].as_str() {
                Some("link") => Entry::Link(e["target"].as_str().unwrap_or_default().into()),
                Some("dir") => Entry::Dir,
                Some("file") | Some("special") => Entry::File,
                _ => Entry::Absent,
            },
            None => {
                let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
                let dir = if dir.is_empty() { "/" } else { dir };
                let listed = self.entries.get(dir).is_some_and(|d| d["listed"] == true);
                if !(listed && name.contains(".so")) {
                    self.gaps.borrow_mut().insert(path.to_string());
                }
                Entry::Absent
            }
        }
    }

    fn elf(&self, real: &str) -> Option<ElfInfo> {
        let lines = self.entries.get(real)?["readelf"].as_array()?.clone();
        let lines: Vec<&str> = lines.iter().filter_map(Value::as_str).collect();
        readelf_info(&lines, self.entries[real]["size"].as_u64().unwrap_or(0))
    }

    fn read(&self, real: &str) -> std::io::Result<Vec<u8>> {
        if real == "/etc/ld.so.cache" {
            Ok(self.cache.clone())
        } else {
            Err(std::io::Error::other(format!(
                "{real} is not in the record"
            )))
        }
    }
}

/// What readelf's `-h -l -d` lines say: the test's own reading, not gpubake's ELF parser.
fn readelf_info(lines: &[&str], bytes: u64) -> Option<ElfInfo> {
    let bracket =
        |l: &str| -> Option<String> { Some(l[l.find('[')? + 1..l.rfind(']')?].to_string()) };
    let mut info = ElfInfo {
        bytes,
        ..ElfInfo::default()
    };
    let mut elf = false;
    for l in lines {
        if l.starts_with("Class:") {
            elf = true;
            info.class64 = l.ends_with("ELF64");
        } else if l.starts_with("Machine:") {
            info.machine = match l.trim_start_matches("Machine:").trim() {
                "Advanced Micro Devices X86-64" => 62,
                "AArch64" => 183,
                _ => 0,
            };
        } else if l.contains("Requesting program interpreter") {
            info.interpreter = l
                .split_once(": ")
                .map(|(_, p)| p.trim_end_matches(']').to_string());
        } else if l.contains("(NEEDED)") {
            info.needed.extend(bracket(l));
        } else if l.contains("(SONAME)") {
            info.soname = bracket(l);
        } else if l.contains("(RPATH)") {
            info.rpath = bracket(l).unwrap().split(':').map(String::from).collect();
        } else if l.contains("(RUNPATH)") {
            info.runpath = bracket(l).unwrap().split(':').map(String::from).collect();
        } else if l.contains("(FLAGS_1)") {
            info.nodeflib = l.split_whitespace().any(|w| w == "NODEFLIB");
        }
    }
    if !info.runpath.is_empty() {
        info.rpath.clear();
    }
    // readelf's lines were kept only for ELF files; an extension module may have a dynamic
    // section with none of these entries (`_json` needs nothing at all).
    elf.then_some(info)
}

/// A file found and the step of the search that found it.
type Found = (String, Option<Via>);

/// Each DT_NEEDED searched, by (name, asking object): what the search mapped.
type Searches = BTreeMap<(String, String), Option<Found>>;

/// One object ld.so set out to load: `file=NAME [0];  needed by|dynamically loaded by BY`,
/// then its search, then `generating link map` when a new object was mapped.
#[derive(Debug, Clone)]
struct Load {
    name: String,
    by: String,
    dlopen: bool,
    /// Before the program got control: the program's own DT_NEEDED closure.
    at_start: bool,
    /// The file mapped (the last one tried, or the name when it has a slash) and the step
    /// that found it; None when no new object was mapped.
    mapped: Option<Found>,
}

/// The events of the program's own process in ld.so's log: from the last `transferring
/// control:` before its `initialize program:` (an exec chain shares one pid) to the end.
fn loads(log: &str, program: &str) -> Vec<Load> {
    let lines: Vec<&str> = log
        .lines()
        .map(|l| l.split_once(":\t").map_or(l, |(_, t)| t))
        .collect();
    let init = lines
        .iter()
        .rposition(|l| *l == format!("initialize program: {program}"))
        .expect("the program's initialisation is in the log");
    let start = lines[..init]
        .iter()
        .rposition(|l| l.starts_with("transferring control:"))
        .map_or(0, |i| i + 1);
    let file =
        regex::Regex::new(r"^file=(\S+) \[0\];  (needed by|dynamically loaded by) (.+) \[0\]$")
            .unwrap();
    let mapped = regex::Regex::new(r"^file=(\S+) \[0\];  generating link map$").unwrap();
    let search = regex::Regex::new(r"^ search path=\S*\t+\((.+)\)$").unwrap();
    let mut out: Vec<Load> = Vec::new();
    let mut at_start = true;
    let mut step: Option<Via> = None;
    let mut tried: Option<String> = None;
    for l in &lines[start..] {
        if l.starts_with("transferring control:") {
            at_start = false;
        } else if let Some(c) = file.captures(l) {
            out.push(Load {
                name: c[1].to_string(),
                by: c[3].to_string(),
                dlopen: &c[2] == "dynamically loaded by",
                at_start,
                mapped: None,
            });
            step = None;
            tried = None;
        } else if let Some(c) = search.captures(l) {
            step = Some(match &c[1] {
                "LD_LIBRARY_PATH" => Via::LdLibraryPath,
                "system search path" => Via::SystemDir,
                s if s.starts_with("RPATH from file") => Via::Rpath,
                s if s.starts_with("RUNPATH from file") => Via::Runpath,
                s => panic!("a search step this test does not know: {s}"),
            });
        } else if l.starts_with(" search cache=") {
            step = Some(Via::LdSoCache);
        } else if let Some(p) = l.strip_prefix("  trying file=") {
            tried = Some(p.to_string());
        } else if let Some(c) = mapped.captures(l) {
            let last = out.last_mut().expect("a link map follows its file= line");
            assert_eq!(
                last.name, &c[1],
                "link map of another name than the last file= line"
            );
            last.mapped = Some(if last.name.contains('/') {
                (last.name.clone(), Some(Via::Path))
            } else {
                (tried.clone().expect("a searched name was tried"), step)
            });
        }
    }
    out
}

fn record() -> Value {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(format!("{root}/{RECORD}")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// What the static view predicts for every load of the log, replaying the dlopen calls
/// (name and caller) in their order; a mismatch is one line each.
struct Replay {
    mismatches: Vec<String>,
    objects: BTreeSet<String>,
    needed_checked: usize,
    dlopens: usize,
    failed_dlopens: usize,
}

fn replay(tree: &Recorded, search: &Search, program: &str, loads: &[Load]) -> Replay {
    let mut linker = Linker::new(tree, search);
    let mut process = linker.start(program).expect("the program is an ELF file");
    let mut mismatches = Vec::new();
    let (mut dlopens, mut failed_dlopens) = (0, 0);
    for load in loads.iter().filter(|l| l.dlopen) {
        assert!(!load.at_start, "a dlopen before the program ran: {load:?}");
        let known: BTreeSet<String> = process
            .objects()
            .map(|(_, real)| real.to_string())
            .collect();
        let Some(bound) = linker.dlopen(&mut process, &load.by, &load.name) else {
            mismatches.push(format!(
                "dlopen({}) by {}: the caller is not loaded",
                load.name, load.by
            ));
            continue;
        };
        dlopens += 1;
        let new = bound.real.as_ref().is_some_and(|r| !known.contains(r));
        let predicted = new.then(|| (bound.path.clone().unwrap(), bound.via));
        if predicted.is_none() {
            failed_dlopens += 1;
        }
        if predicted != load.mapped {
            mismatches.push(format!(
                "dlopen({}) by {}: ld.so mapped {:?}, predicted {:?}",
                load.name, load.by, load.mapped, predicted
            ));
        }
    }
    // Every DT_NEEDED ld.so searched for, against the static closure's own searches.
    let logged: Searches = loads
        .iter()
        .filter(|l| !l.dlopen)
        .map(|l| ((l.name.clone(), l.by.clone()), l.mapped.clone()))
        .collect();
    let predicted: Searches = process
        .libraries()
        .iter()
        .filter(|b| b.via != Some(Via::Loaded))
        .map(|b| {
            (
                (b.needed.clone(), b.by.clone()),
                b.path.clone().map(|p| (p, b.via)),
            )
        })
        .collect();
    for key in logged
        .keys()
        .chain(predicted.keys())
        .collect::<BTreeSet<_>>()
    {
        let (l, p) = (logged.get(key), predicted.get(key));
        if l != p {
            mismatches.push(format!(
                "{} needed by {}: ld.so {:?}, predicted {:?}",
                key.0, key.1, l, p
            ));
        }
    }
    Replay {
        mismatches,
        objects: process
            .objects()
            .map(|(_, real)| real.to_string())
            .collect(),
        needed_checked: logged.len(),
        dlopens,
        failed_dlopens,
    }
}

#[test]
fn the_static_closure_of_the_h200_torch_process_is_what_ld_so_loaded_and_mapped() {
    let record = record();
    let process = &record["process"];
    let program = process["executable"].as_str().unwrap();
    let tree = Recorded::load(&record);
    let env = [(
        "LD_LIBRARY_PATH".to_string(),
        process["LD_LIBRARY_PATH"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )];
    let search = Search::of_tree(&tree, &env).unwrap();
    let loads = loads(record["ld_debug"].as_str().unwrap(), program);
    let run = replay(&tree, &search, program, &loads);
    assert!(
        run.mismatches.is_empty(),
        "{} of ld.so's loads predicted otherwise:\n{}",
        run.mismatches.len(),
        run.mismatches.join("\n")
    );

    // The objects the static view loaded are exactly the ELF files mapped into the process.
    let mapped: BTreeSet<String> = process["maps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|p| tree.elf(p).is_some())
        .map(String::from)
        .collect();
    let missing: Vec<&String> = mapped.difference(&run.objects).collect();
    let extra: Vec<&String> = run.objects.difference(&mapped).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "mapped but not predicted: {missing:#?}\npredicted but not mapped: {extra:#?}"
    );
    let gaps = tree.gaps.borrow();
    assert!(
        gaps.is_empty(),
        "the search asked the record for paths it does not cover: {gaps:#?}"
    );

    // The record has what the comparison claims: torch's CUDA libraries from the wheels and
    // the driver's from its own directory, though /usr/local/cuda's are on the cache's path.
    for lib in [
        "libcudart.so.13",
        "libcublasLt.so.13",
        "libnccl.so.2",
        "libcudnn.so.9",
    ] {
        assert!(
            mapped
                .iter()
                .any(|p| p.ends_with(lib) && p.contains("/site-packages/nvidia/")),
            "{lib} mapped from the wheels"
        );
    }
    assert!(
        mapped
            .iter()
            .any(|p| p.starts_with("/usr/local/nvidia/lib64/libcuda.so."))
    );
    // The steps of ld.so's search the record exercises (each load's finding step). DT_RPATH
    // inherited from a loader and $ORIGIN of the main program are not among them: torch
    // preloads its libraries by path; tests/links.rs holds those rules to ldd and lddtree.
    let mut steps: BTreeMap<String, usize> = BTreeMap::new();
    for l in &loads {
        if let Some((_, via)) = &l.mapped {
            *steps.entry(format!("{via:?}")).or_default() += 1;
        }
    }
    for want in [
        "Some(Path)",
        "Some(Rpath)",
        "Some(Runpath)",
        "Some(LdLibraryPath)",
        "Some(LdSoCache)",
    ] {
        assert!(
            steps.contains_key(want),
            "the record exercises {want}: {steps:?}"
        );
    }
    println!(
        "{} objects mapped and predicted; {} DT_NEEDED searches and {} dlopen calls ({} that \
         mapped nothing) each bound to the file and search step ld.so used; steps that found \
         a file: {steps:?}; {} paths recorded",
        mapped.len(),
        run.needed_checked,
        run.dlopens,
        run.failed_dlopens,
        tree.entries.len()
    );
}

/// The comparison can fail: the same record with the search changed in one rule ld.so
/// follows (the config's LD_LIBRARY_PATH not searched) is told apart, with the libraries it
/// moves named.
#[test]
fn a_search_that_skips_one_of_ld_so_s_rules_mispredicts_the_recorded_process() {
    let record = record();
    let program = record["process"]["executable"].as_str().unwrap();
    let tree = Recorded::load(&record);
    let search = Search::of_tree(&tree, &[]).unwrap();
    let loads = loads(record["ld_debug"].as_str().unwrap(), program);
    let run = replay(&tree, &search, program, &loads);
    assert!(
        run.mismatches
            .iter()
            .any(|m| m.starts_with("dlopen(libcuda.so.1)")),
        "without LD_LIBRARY_PATH libcuda.so.1 is found elsewhere or not at all: {:#?}",
        run.mismatches
    );
}

#[test]
fn the_recorded_tree_resolves_links_as_the_kernel_does() {
    let record = record();
    let tree = Recorded::load(&record);
    let program = record["process"]["executable"].as_str().unwrap();
    assert_eq!(
        real_path(&tree, program).as_deref(),
        record["process"]["real_executable"].as_str()
    );
}
