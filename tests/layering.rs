//! The modules stand on floors that follow the data: a recipe is resolved into a lock, a
//! lock is baked into an image, the image is run and probed, and certify gives the verdict.
//! Each file under src/ may import (`crate::NAME`) only modules of its own floor or below;
//! a file whose module has no floor here fails too, so a new module is placed on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom to top.
const FLOORS: &[(&str, &[&str])] = &[
    // What every stage uses: errors, files, documents, versions, child processes, the NCCL
    // and compatibility knowledge, the node's CDI specs, the Docker Engine's API, the HTTP agent;
    // and the names gpubake gives: the paths it owns in an image and a Python project's PEP 503
    // name, here because the recipe, the lock and the closure all speak of them and the three
    // would import one another otherwise.
    (
        "foundation",
        &[
            "error",
            "fsutil",
            "interrupt",
            "document",
            "version",
            "child",
            "units",
            "progress",
            "verdict",
            "nccl",
            "compat",
            "cdi",
            "engine",
            "net",
            "names",
        ],
    ),
    // OCI images and nothing of gpubake's own: model, layouts, archives, registries, layers;
    // the Debian archive client beside them (sources, InRelease, Packages, apt's choice); and
    // signatures (keys, DSSE, in-toto statements, Sigstore bundles) over what they hold.
    ("image", &["image", "debian", "sign"]),
    // From a recipe to a lock: recipes, presets, the linter, resolution, the Python closure,
    // wheels, the SBOM of a lock, the record of what a job's start-up reads (kept beside it).
    (
        "plan",
        &[
            "recipe", "preset", "lint", "resolve", "lock", "closure", "wheel", "sbom", "startup",
        ],
    ),
    // From a lock to an image, and reading a gpubake image back.
    ("bake", &["bake"]),
    // Running an image and probing a node.
    ("run", &["runtime", "probe"]),
    // The verdict.
    ("certify", &["certify"]),
    // The commands.
    ("command", &["cmd", "main", "lib"]),
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|(_, mods)| mods.contains(&module))
}

/// Every .rs file under `dir` with its module: the first path component under src/.
fn sources(dir: &Path, src: &Path, out: &mut Vec<(String, String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, src, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let module = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            out.push((rel, module, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The modules a file imports through `crate::`, comments left out (a doc link to a higher
/// module is no import).
fn imports(text: &str) -> Vec<String> {
    let name = regex::Regex::new(r"\bcrate::([a-z_]+)").unwrap();
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .flat_map(|l| {
            name.captures_iter(l)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn no_module_imports_one_on_a_higher_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    let mut upward: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (file, module, text) in &files {
        let Some(mine) = floor_of(module) else {
            panic!("src/{file}: module `{module}` has no floor in tests/layering.rs");
        };
        for import in imports(text) {
            let Some(theirs) = floor_of(&import) else {
                panic!("src/{file} imports `crate::{import}`, which has no floor");
            };
            if theirs > mine {
                upward
                    .entry(format!("src/{file} ({})", FLOORS[mine].0))
                    .or_default()
                    .push(format!("crate::{import} ({})", FLOORS[theirs].0));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up a floor:\n{}",
        upward
            .iter()
            .map(|(f, i)| format!("  {f} -> {}", i.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!(
        "{} files on {} floors, no import runs upward",
        files.len(),
        FLOORS.len()
    );
}

/// The rule has teeth: an import from the image library of the bake pipeline is caught.
#[test]
fn an_import_from_the_image_library_of_the_bake_pipeline_is_upward() {
    let found = imports("use crate::bake::stack::VENV; // crate::certify in a comment\n");
    assert_eq!(found, ["bake"]);
    assert!(floor_of("bake") > floor_of("image"));
    assert!(imports("/// [`crate::bake`]").is_empty());
}

/// The files a file imports through `crate::`: each path's longest prefix that names a file
/// under src/ (`crate::bake::stack::VENV` is bake/stack.rs, `crate::image::Platform`
/// image/mod.rs), the file itself left out.
fn imported_files(file: &str, text: &str, known: &BTreeSet<&str>) -> BTreeSet<String> {
    let path = regex::Regex::new(r"\bcrate((?:::[a-z_][a-z0-9_]*)+)").unwrap();
    let mut out = BTreeSet::new();
    for line in text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
    {
        for c in path.captures_iter(line) {
            let segments: Vec<&str> = c[1].trim_start_matches("::").split("::").collect();
            let target = (1..=segments.len()).rev().find_map(|n| {
                let stem = segments[..n].join("/");
                [format!("{stem}.rs"), format!("{stem}/mod.rs")]
                    .into_iter()
                    .find(|f| known.contains(f.as_str()))
            });
            if let Some(target) = target.filter(|t| t != file) {
                out.insert(target);
            }
        }
    }
    out
}

/// A path of imports from `from` to `to`, both ends included, if there is one (breadth first,
/// so the shortest).
fn import_path(
    graph: &BTreeMap<&str, BTreeSet<String>>,
    from: &str,
    to: &str,
) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::from([(from, from)]);
    let mut queue = std::collections::VecDeque::from([from]);
    while let Some(file) = queue.pop_front() {
        if file == to {
            let mut path = vec![to.to_string()];
            let mut at = to;
            while at != from {
                at = came_from[at];
                path.push(at.to_string());
            }
            path.reverse();
            return Some(path);
        }
        for next in graph.get(file).into_iter().flatten() {
            if !came_from.contains_key(next.as_str()) {
                came_from.insert(next, file);
                queue.push_back(next);
            }
        }
    }
    None
}

/// No two modules import each other, directly or around a circle of files: a circle that
/// crosses modules ties them into one, and the floors say nothing of which stands on which.
/// Files of one module (bake/*.rs, probe/*.rs) may import one another freely. A circle
/// between modules has an import that crosses from one to the other, so each crossing import
/// a -> b is checked for a way back from b to a.
#[test]
fn no_import_circle_crosses_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    let known: BTreeSet<&str> = files.iter().map(|(f, _, _)| f.as_str()).collect();
    let module: BTreeMap<&str, &str> = files
        .iter()
        .map(|(f, m, _)| (f.as_str(), m.as_str()))
        .collect();
    let graph: BTreeMap<&str, BTreeSet<String>> = files
        .iter()
        .map(|(f, _, text)| (f.as_str(), imported_files(f, text, &known)))
        .collect();
    let mut circles = Vec::new();
    for (file, imported) in &graph {
        for target in imported
            .iter()
            .filter(|t| module[t.as_str()] != module[file])
        {
            if let Some(back) = import_path(&graph, target, file) {
                circles.push(format!("src/{file} -> src/{}", back.join(" -> src/")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "imports that run in a circle between modules:\n  {}",
        circles.join("\n  ")
    );
}

/// The circle check has teeth: paths resolve to the file that holds them, and a circle through
/// a third module is found.
#[test]
fn a_circle_through_a_third_module_is_found() {
    let known = BTreeSet::from(["recipe.rs", "lock.rs", "preset.rs", "image/mod.rs"]);
    let imports = imported_files(
        "recipe.rs",
        "use crate::lock::VENV;\nlet p: crate::image::Platform; // crate::preset\n",
        &known,
    );
    assert_eq!(
        imports,
        BTreeSet::from(["lock.rs".into(), "image/mod.rs".into()])
    );
    let graph = BTreeMap::from([
        ("recipe.rs", imports),
        ("lock.rs", BTreeSet::from(["preset.rs".into()])),
        ("preset.rs", BTreeSet::from(["recipe.rs".into()])),
    ]);
    assert_eq!(
        import_path(&graph, "lock.rs", "recipe.rs").unwrap(),
        ["lock.rs", "preset.rs", "recipe.rs"]
    );
    assert_eq!(import_path(&graph, "image/mod.rs", "recipe.rs"), None);
}

/// Every function in src/ by its length in lines, longest first: (lines, file, name). A
/// function is counted from its `fn` line to the closing brace at the same indentation.
fn function_lengths(files: &[(String, String, String)]) -> Vec<(usize, String, String)> {
    let start = regex::Regex::new(r"^(\s*)(pub(\([a-z]+\))? )?(async )?(const )?fn (\w+)").unwrap();
    let mut out = Vec::new();
    for (file, _, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(c) = start.captures(line) else {
                continue;
            };
            // A trait's declaration has no body to count.
            if line.trim_end().ends_with(';') {
                continue;
            }
            let close = format!("{}}}", &c[1]);
            if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
                out.push((end + 2, file.clone(), c[6].to_string()));
            }
        }
    }
    out.sort_by(|a, b| b.cmp(a));
    out
}

/// Commands stay thin and functions short: no function in src/ over 150 lines, no command's
/// `run` over 100. With `--nocapture` it prints the figures of the structure: files and
/// lines per floor, and the ten longest functions.
#[test]
fn functions_stay_short_and_commands_thin() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    for (name, mods) in FLOORS {
        let on: Vec<&(String, String, String)> = files
            .iter()
            .filter(|(_, m, _)| mods.contains(&m.as_str()))
            .collect();
        let lines: usize = on.iter().map(|(_, _, t)| t.lines().count()).sum();
        println!("{name:>10}: {:>3} files, {lines:>6} lines", on.len());
    }
    let lengths = function_lengths(&files);
    println!("ten longest functions:");
    for (n, file, name) in lengths.iter().take(10) {
        println!("  {n:>4}  src/{file}: {name}");
    }
    let long: Vec<String> = lengths
        .iter()
        .filter(|(n, file, name)| {
            *n > 150 || (file.starts_with("cmd/") && name == "run" && *n > 100)
        })
        .map(|(n, file, name)| format!("src/{file}: {name} ({n} lines)"))
        .collect();
    assert!(long.is_empty(), "too long: {long:#?}");
}

/// `gpubake build` stays a thin command: the pipeline is the library's (`bake::pipeline`),
/// and the command turns its flags into a request, runs it and prints. It signs, resolves
/// closures, writes SBOMs, fetches wheels and writes image stores through that alone.
#[test]
fn the_build_command_leaves_the_pipeline_to_the_library() {
    const THE_LIBRARY_S: [&str; 11] = [
        "crate::sign",
        "crate::closure",
        "crate::sbom",
        "crate::wheel",
        "crate::image::registry",
        "crate::image::layout",
        "crate::image::layer",
        "crate::image::archive",
        "crate::image::stream",
        "crate::image::referrers",
        "crate::image::signature",
    ];
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cmd/build.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines = text.lines().count();
    assert!(lines <= 200, "src/cmd/build.rs has {lines} lines, over 200");
    let path = regex::Regex::new(r"\bcrate(::[A-Za-z_][A-Za-z0-9_]*)+(::\{)?").unwrap();
    let reached: Vec<String> = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .flat_map(|l| {
            path.find_iter(l)
                .map(|m| m.as_str().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|p| {
            p.ends_with("::{") && p.starts_with("crate::image")
                || THE_LIBRARY_S
                    .iter()
                    .any(|m| p == m || p.starts_with(&format!("{m}::")))
        })
        .collect();
    assert!(
        reached.is_empty(),
        "src/cmd/build.rs reaches past bake: {reached:?}"
    );
}

/// The module that owns each command's job: the command calls it, and beside it only the
/// foundation and the types its arguments become, never a module below its owner.
const OWNERS: &[(&str, &[&str])] = &[
    ("build", &["bake"]),
    ("render", &["bake"]),
    ("install", &["bake"]),
    ("inspect", &["bake"]),
    // A lock is resolve's; pinned against a base, with its closures beside it, bake's.
    ("resolve", &["bake", "resolve"]),
    ("copy", &["image"]),
    ("gc", &["bake"]),
    ("certify", &["certify"]),
    ("verify", &["certify"]),
    ("lint", &["lint"]),
    ("presets", &["preset"]),
    ("compat", &["compat"]),
    ("key", &["sign"]),
    ("probe", &["probe"]),
    ("probe_worker", &["probe"]),
    ("preflight", &["probe"]),
    ("shell", &[]),
    // The arguments every command shares.
    ("mod", &[]),
];

/// What a command's arguments become, whatever its owner: an image reference, its platform
/// and the registry options, a layer compression, a recipe, a key file, the resolve options
/// (`--driver`, `--preset-dir`).
const ARGUMENT_TYPES: &[&str] = &[
    "image::Transport",
    "image::Platform",
    "image::Compression",
    "image::registry::Access",
    "recipe::LoadedRecipe",
    "recipe::DEFAULT_RECIPE",
    "sign::keys",
    "sign::signing_key",
    "resolve::Options",
];

/// Every `crate::` path `text` names outside comments, with `{a, b::c}` groups spread out.
fn crate_paths(text: &str) -> Vec<String> {
    let path =
        regex::Regex::new(r"\bcrate((?:::[A-Za-z_][A-Za-z0-9_]*)+)(::\{([^}]*)\})?").unwrap();
    let mut out = Vec::new();
    for line in text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
    {
        for c in path.captures_iter(line) {
            let stem = c[1].trim_start_matches("::").to_string();
            match c.get(3) {
                None => out.push(stem),
                Some(group) => out.extend(
                    group
                        .as_str()
                        .split(',')
                        .map(str::trim)
                        .filter(|item| !item.is_empty())
                        .map(|item| match item {
                            "self" => stem.clone(),
                            _ => format!("{stem}::{item}"),
                        }),
                ),
            }
        }
    }
    out
}

/// The paths of `text` that pass the owners and reach a module below them.
fn past_the_owner(text: &str, owners: &[&str]) -> Vec<String> {
    let foundation = FLOORS[0].1;
    crate_paths(text)
        .into_iter()
        .filter(|p| {
            let module = p.split("::").next().unwrap_or_default();
            let named = |t: &&str| p == t || p.starts_with(&format!("{t}::"));
            !(owners.contains(&module)
                || foundation.contains(&module)
                || ARGUMENT_TYPES.iter().any(named))
        })
        .collect()
}

#[test]
fn each_command_calls_the_module_that_owns_its_job() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cmd");
    let mut past = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let Some((_, owners)) = OWNERS.iter().find(|(c, _)| *c == name) else {
            panic!("src/cmd/{name}.rs: no owner in tests/layering.rs's OWNERS");
        };
        let text = std::fs::read_to_string(&path).unwrap();
        for p in past_the_owner(&text, owners) {
            past.push(format!(
                "src/cmd/{name}.rs (owner {owners:?}) -> crate::{p}"
            ));
        }
    }
    assert!(
        past.is_empty(),
        "commands that reach past their owner:\n  {}",
        past.join("\n  ")
    );
}

/// The rule has teeth: a call below the owner is caught, in a group as alone, while the
/// owner, the foundation and an argument type pass.
#[test]
fn a_command_reaching_below_its_owner_is_caught() {
    let text = "use crate::bake::stack::{self, install};\n\
                use crate::image::{Platform, layer::materialize};\n\
                let c = crate::wheel::cache::WheelCache::open(dir)?; // crate::sbom in a comment\n\
                crate::fsutil::write_atomic(p, b)?;";
    assert_eq!(
        past_the_owner(text, &["bake"]),
        [
            "image::layer::materialize",
            "wheel::cache::WheelCache::open"
        ]
    );
}
