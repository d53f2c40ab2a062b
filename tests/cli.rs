//! The command line end to end: the default main job, exit codes, and bad input of every
//! kind answered with a located message instead of a panic.

mod common;

use common::{assert_exit, gpubake, gpubake_in, recipe, stderr, stdout, write};

#[test]
fn default_main_job_prints_the_lock_and_its_reasons() {
    let out = gpubake(&["resolve"]);
    assert_exit(&out, 0);
    let lock = stdout(&out);
    assert!(lock.contains("requirement: torch==2.9.1+cu128"), "{lock}");
    assert!(lock.contains("rule: "), "{lock}");
    assert!(lock.contains("by: preset nvlink"), "{lock}");
    assert!(
        stderr(&out).contains("built-in default"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_default_recipe_works_outside_the_repository() {
    let dir = tempfile::tempdir().unwrap();
    let out = gpubake_in(dir.path(), &["resolve"]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("builtin:env-presets/nvlink.yaml"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn output_files_are_written_whole_and_match_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpubake.lock");
    std::fs::write(&path, "stale").unwrap();
    let file = path.to_str().unwrap();
    assert_exit(
        &gpubake(&[
            "resolve",
            "recipes/h100-pytorch2.9.yaml",
            "-o",
            file,
            "--no-closure",
        ]),
        0,
    );
    let printed = stdout(&gpubake(&["resolve", "recipes/h100-pytorch2.9.yaml"]));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), printed);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary files left"
    );
}

/// An output replaced through a temporary file keeps the mode of the file it replaces; a new
/// one gets 0666 less the umask, as any program's would.
#[test]
fn output_files_keep_their_mode_or_follow_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpubake.lock");
    let file = path.to_str().unwrap();
    let resolve = |mask| {
        let args = [
            "resolve",
            "recipes/h100-pytorch2.9.yaml",
            "-o",
            file,
            "--no-closure",
        ];
        assert_exit(&common::gpubake_umask(mask, &args), 0);
    };
    resolve("022");
    assert_eq!(common::mode(&path), 0o644);
    std::fs::remove_file(&path).unwrap();
    resolve("027");
    assert_eq!(common::mode(&path), 0o640);
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o604)).unwrap();
    resolve("022");
    assert_eq!(
        common::mode(&path),
        0o604,
        "the replaced file's mode is kept"
    );
}

#[test]
fn explain_lists_every_candidate() {
    let out = gpubake(&["resolve", "--explain", "recipes/h100-pytorch2.9.yaml"]);
    assert_exit(&out, 0);
    let err = stderr(&out);
    assert!(err.contains("* torch 2.9+cu128: chosen"), "{err}");
    assert!(
        err.contains("- torch 2.10+cu128: torch 2.10 does not match pytorch `2.9`"),
        "{err}"
    );
}

#[test]
fn driver_flag_overrides_the_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let r = write(
        dir.path(),
        "r.yaml",
        &recipe("pytorch: '2.11'\ncuda: '13.0'\ndriver: '>=580'\n"),
    );
    assert_exit(&gpubake(&["resolve", &r]), 0);
    let out = gpubake(&["resolve", &r, "--driver", "550.54.15"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("the fleet floor is 550.54.15"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn conflicts_exit_2_with_an_explanation() {
    let dir = tempfile::tempdir().unwrap();
    let r = write(
        dir.path(),
        "r.yaml",
        &recipe("pytorch: '2.9'\npython: '3.15'\n"),
    );
    let out = gpubake(&["resolve", &r]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("no PyTorch build meets every constraint"),
        "{err}"
    );
    assert!(err.contains("what would run instead"), "{err}");
}

/// Every malformed input exits 2 with `file:line:col` (or the file) first and no panic.
#[test]
fn bad_input_is_located_and_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        (
            "malformed.yaml",
            "name: a\n  base: : x\n",
            "malformed.yaml:2:",
        ),
        (
            "wrong-type.yaml",
            "name: a\nbase: x\npytorch: '2.9'\ngpus: h100\n",
            "wrong-type.yaml:4:7: field `gpus`: invalid type",
        ),
        (
            "unknown-key.yaml",
            "name: a\nbase: x\npytorhc: '2.9'\n",
            "unknown-key.yaml:3:1: field `pytorhc`: unknown field",
        ),
        ("empty.yaml", "", "empty.yaml: the file is empty"),
        (
            "comments.yaml",
            "# nothing here\n",
            "comments.yaml: the file is empty",
        ),
        (
            "list.yaml",
            "- a\n- b\n",
            "list.yaml:1:1: invalid type: sequence",
        ),
        (
            "bad-version.yaml",
            "name: a\nbase: x\npytorch: two\n",
            "bad-version.yaml:3:10: field `pytorch`",
        ),
        (
            "dup.yaml",
            "name: a\nbase: x\npytorch: '2.9'\nenv:\n  A: '1'\n  A: '2'\n",
            "is given twice",
        ),
        (
            "bad-env.yaml",
            "name: a\nbase: x\npytorch: '2.9'\nenv:\n  A: [1]\n",
            "bad-env.yaml:5:6: field `env.A`",
        ),
        (
            "missing.yaml",
            "name: a\nbase: x\n",
            "missing field `pytorch`",
        ),
        (
            "preset.yaml",
            "name: a\nbase: x\npytorch: '2.9'\npresets: [nvlnk]\n",
            "preset.yaml:4:11: no preset named `nvlnk` (did you mean `nvlink`?)",
        ),
        ("alias.yaml", "name: &n a\nbase: *n\npytorch: '2.9'\n", ""),
    ];
    for (name, text, expected) in cases {
        let path = write(dir.path(), name, text);
        let out = gpubake(&["resolve", &path]);
        let err = stderr(&out);
        if *name == "alias.yaml" {
            // YAML aliases are legal; the recipe simply resolves.
            assert_exit(&out, 0);
            continue;
        }
        assert_exit(&out, 2);
        assert!(
            err.contains(expected),
            "{name}: expected `{expected}` in:\n{err}"
        );
        assert!(
            err.contains(&path) || err.contains(name),
            "{name}: the file is not named:\n{err}"
        );
    }
}

#[test]
fn allowed_values_are_listed_for_type_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "r.yaml",
        "name: a\nbase: x\npytorch: '2.9'\ngpus: h100\n",
    );
    let err = stderr(&gpubake(&["resolve", &path]));
    assert!(
        err.contains("allowed: a list of GPU models or sm archs"),
        "{err}"
    );
}

#[test]
fn huge_and_binary_files_are_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.yaml");
    let line = "# padding padding padding padding padding padding padding padding\n";
    std::fs::write(&big, line.repeat(10 * 1024 * 1024 / line.len())).unwrap();
    let out = gpubake(&["resolve", big.to_str().unwrap()]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("big.yaml: file is"),
        "{}",
        stderr(&out)
    );
    let out = gpubake(&["lint", big.to_str().unwrap()]);
    assert_exit(&out, 2);

    let binary = dir.path().join("bin.yaml");
    std::fs::write(&binary, [0x6eu8, 0x61, 0xff, 0xfe, 0x00]).unwrap();
    let out = gpubake(&["resolve", binary.to_str().unwrap()]);
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("not UTF-8"), "{}", stderr(&out));
}

#[test]
fn deeply_nested_yaml_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    // 400k levels stay under the size cap; a parser without a depth limit would take minutes.
    let deep = format!(
        "name: a\nbase: x\npytorch: '2.9'\nlabels: {}{}\n",
        "[".repeat(400_000),
        "]".repeat(400_000)
    );
    let path = write(dir.path(), "deep.yaml", &deep);
    for cmd in ["resolve", "lint", "render"] {
        let out = gpubake(&[cmd, &path]);
        assert_exit(&out, 2);
        let text = stderr(&out) + &stdout(&out);
        assert!(
            text.contains("deep.yaml:4:") && text.contains("nests deeper"),
            "{cmd}: {text}"
        );
    }
}

#[test]
fn missing_files_and_usage_errors_exit_2() {
    let out = gpubake(&["resolve", "no/such/recipe.yaml"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("no/such/recipe.yaml"),
        "{}",
        stderr(&out)
    );
    assert_exit(&gpubake(&["resolve", "--driver", "five"]), 2);
    assert_exit(&gpubake(&["frobnicate"]), 2);
}

/// A layer limit too large to count in bytes is a usage error, not a limit wrapped to 0.
#[test]
fn a_layer_limit_past_u64_bytes_is_a_usage_error() {
    let out = gpubake(&[
        "certify",
        "--max-layer-gib",
        "17179869184",
        "oci:/nonexistent/layout",
    ]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("--max-layer-gib 17179869184: too large"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn every_command_documents_an_example() {
    for cmd in ["resolve", "lint", "presets", "render", "compat"] {
        let out = gpubake(&[cmd, "--help"]);
        assert_exit(&out, 0);
        assert!(
            stdout(&out).contains("Example: gpubake"),
            "{cmd} --help has no example"
        );
    }
}

#[test]
fn compat_prints_text_and_json() {
    let out = gpubake(&["compat", "--release", "2.9"]);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(text.contains("cu128"), "{text}");
    assert!(
        text.contains("2.27.7?"),
        "unconfirmed values carry a mark:\n{text}"
    );
    assert!(!text.contains("cu132"), "only 2.9 was asked for:\n{text}");
    let out = gpubake(&["compat", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(json["releases"].as_array().unwrap().len(), 12);
}

#[test]
fn presets_list_show_and_diff() {
    let list = stdout(&gpubake(&["presets", "list"]));
    for name in ["base", "nvlink", "pcie", "infiniband", "roce", "debug"] {
        assert!(
            list.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{list}"
        );
    }
    let show = stdout(&gpubake(&["presets", "show", "roce"]));
    assert!(
        show.contains("NCCL_IB_TIMEOUT=22\n    from preset infiniband"),
        "{show}"
    );
    assert!(
        show.contains("NCCL_DEBUG=WARN\n    from preset base"),
        "{show}"
    );
    let out = gpubake(&["presets", "diff", "pcie", "nvlink"]);
    assert_exit(&out, 1);
    assert_exit(&gpubake(&["presets", "diff", "nvlink", "nvlink"]), 0);
    let diff = stdout(&out);
    assert!(
        diff.contains(
            "NCCL_P2P_LEVEL\n    pcie: PXB (preset pcie)\n    nvlink: NVL (preset nvlink)"
        ),
        "{diff}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&gpubake(&["presets", "show", "nvlink", "--json"]))).unwrap();
    assert_eq!(json["NCCL_P2P_LEVEL"]["value"], "NVL");
    let out = gpubake(&["presets", "show", "nope"]);
    assert_exit(&out, 2);
}

#[test]
fn ci_examples_parse_and_use_real_commands() {
    for file in [
        "github-actions.yml",
        "gitlab-ci.yml",
        "k8s-preflight-job.yaml",
    ] {
        let text = std::fs::read_to_string(common::root().join("examples/ci").join(file)).unwrap();
        let _: serde_yaml::Value =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        // Commands only: comments mention gpubake in prose.
        let commands = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.contains("name:"))
            .map(|l| l.split(" #").next().unwrap_or(""));
        for line in commands.filter(|l| l.contains("gpubake ")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let Some(i) = words
                .iter()
                .position(|w| w.trim_matches(|c| c == '"' || c == '[' || c == ',') == "gpubake")
            {
                let cmd = words
                    .get(i + 1)
                    .map(|w| w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-'));
                if let Some(cmd) = cmd.filter(|c| !c.is_empty() && !c.starts_with("--")) {
                    assert_exit(&gpubake(&[cmd, "--help"]), 0);
                }
            }
        }
    }
}

#[test]
fn compat_names_the_known_releases_for_an_unknown_one() {
    let out = gpubake(&["compat", "--release", "2.99"]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("--release 2.99") && err.contains("2.9, "),
        "{err}"
    );
    assert_exit(&gpubake(&["compat", "--release", "2.9"]), 0);
}

/// `--offline` without a pylock is a missing input (exit 2), not something the machine lacks,
/// and is found before the base is read.
#[test]
fn offline_without_a_pylock_is_bad_input() {
    // A build reads its base first: this one has the CPython the lock pins.
    let Some(base) = common::debian_base() else {
        return;
    };
    let from = format!("oci:{}:bookworm", base.display());
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: off\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n",
    );
    let to = format!("oci:{}", dir.path().join("out").display());
    let out = gpubake(&["build", &recipe, "--offline", "--from", &from, "--to", &to]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("--offline needs the closure") && err.contains("pylock.off.toml"),
        "{err}"
    );
}

/// One broken preset file does not hide the others from `presets list`: it is named with its
/// error and the listing exits 2; an unknown name says where it was looked for.
#[test]
fn a_broken_preset_file_is_named_and_the_rest_are_listed() {
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("env-presets");
    std::fs::create_dir_all(&presets).unwrap();
    std::fs::write(presets.join("broken.yaml"), "env: [not, a, map\n").unwrap();
    let out = common::gpubake_in(dir.path(), &["presets", "list"]);
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert!(
        common::stdout(&out).contains("nvlink"),
        "{}",
        common::stdout(&out)
    );
    assert!(
        common::stderr(&out).contains("broken"),
        "{}",
        common::stderr(&out)
    );

    let out = common::gpubake_in(dir.path(), &["presets", "show", "nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(err.contains("looked in env-presets"), "{err}");
    assert!(err.contains("the built-in presets"), "{err}");
}

/// A reader that stops early closes the pipe: gpubake ends as `cat` would, by SIGPIPE,
/// with no panic on standard error (`gpubake resolve --json | head -3` printed one).
#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    // One writes through the lock's writer, one prints a table.
    for args in [&["resolve", "--no-closure", "--json"][..], &["compat"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {:?}: {err}",
            out.status
        );
    }
}

/// The repository's own `env-presets/` are the built-in presets: resolving from its root (as
/// the README's examples do) hides nothing, so nothing is announced. A copy with one byte
/// changed is announced.
#[test]
fn a_local_copy_of_a_builtin_preset_is_not_announced() {
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("env-presets");
    std::fs::create_dir_all(&presets).unwrap();
    let shipped = std::fs::read_to_string(common::root().join("env-presets/base.yaml")).unwrap();
    std::fs::write(presets.join("base.yaml"), &shipped).unwrap();
    common::write(
        dir.path(),
        "r.yaml",
        "name: r\nbase: x\npytorch: '2.9'\npresets: [base]\n",
    );
    let out = common::gpubake_in(dir.path(), &["resolve", "r.yaml", "--no-closure"]);
    assert_exit(&out, 0);
    let err = common::stderr(&out);
    assert!(!err.contains("takes the place"), "{err}");

    std::fs::write(presets.join("base.yaml"), format!("{shipped}\n")).unwrap();
    let out = common::gpubake_in(dir.path(), &["resolve", "r.yaml", "--no-closure"]);
    let err = common::stderr(&out);
    assert!(err.contains("takes the place"), "{err}");
}

/// A `./env-presets/base.yaml` takes the place of the built-in `base`: resolve says so.
#[test]
fn a_local_preset_that_shadows_a_builtin_is_announced() {
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("env-presets");
    std::fs::create_dir_all(&presets).unwrap();
    std::fs::write(
        presets.join("base.yaml"),
        "description: local\nenv:\n  NCCL_DEBUG: {value: WARN, reason: quiet}\n",
    )
    .unwrap();
    common::write(
        dir.path(),
        "r.yaml",
        "name: r\nbase: x\npytorch: '2.9'\npresets: [base]\n",
    );
    let out = common::gpubake_in(dir.path(), &["resolve", "r.yaml", "--no-closure"]);
    let err = common::stderr(&out);
    assert!(
        err.contains("preset `base` is read from") && err.contains("built-in preset"),
        "{err}"
    );
}

#[test]
fn allow_files_outside_is_offered_by_the_commands_that_read_a_recipe_only() {
    for cmd in ["resolve", "render", "build"] {
        let out = gpubake(&[cmd, "--help"]);
        assert_exit(&out, 0);
        assert!(stdout(&out).contains("--allow-files-outside"), "{cmd}");
    }
    for cmd in [
        "copy", "inspect", "verify", "install", "certify", "probe", "lint",
    ] {
        let out = gpubake(&[cmd, "--help"]);
        assert_exit(&out, 0);
        assert!(!stdout(&out).contains("--allow-files-outside"), "{cmd}");
    }
    let out = gpubake(&["verify", "--allow-files-outside", "oci:./nowhere"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("unexpected argument '--allow-files-outside'"),
        "{}",
        stderr(&out)
    );
}

/// `build` refuses what `certify` would fail the image for, before it builds, unless
/// `--skip-checks`; `resolve` refuses a torch pin beside `pytorch:`.
#[test]
fn build_refuses_recipes_certify_would_fail_unless_told_to_skip_checks() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let from = common::from_base();
    for (name, env, said) in [
        (
            "p2p.yaml",
            "NCCL_P2P_DISABLE: \"true\"",
            "error[not-a-number]: NCCL_P2P_DISABLE",
        ),
        ("secret.yaml", "AWS_SECRET_ACCESS_KEY: abc", "error[secret]"),
    ] {
        let recipe = write(
            dir.path(),
            name,
            &format!("name: gate\nbase: x\npytorch: '2.9'\npresets: [base]\nenv:\n  {env}\n"),
        );
        let layout = dir.path().join(name.replace(".yaml", ""));
        let to = format!("oci:{}:v1", layout.display());
        let out = gpubake(&common::build_args(&recipe, &from, &to, &[]));
        assert_exit(&out, 2);
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{name}:6:"))
                && err.contains(said)
                && err.contains("--skip-checks"),
            "{err}"
        );
        assert!(!layout.exists(), "a refused build writes nothing");
        let out = gpubake(&common::build_args(&recipe, &from, &to, &["--skip-checks"]));
        assert_exit(&out, 0);
        // What was built anyway is what certify fails.
        let out = gpubake(&["certify", &to, "--gpus", "none"]);
        assert_exit(&out, 1);
    }
    let recipe = write(
        dir.path(),
        "pip.yaml",
        "name: gate\nbase: x\npytorch: '2.9'\npip: ['torch==2.8.0']\n",
    );
    let out = gpubake(&["resolve", &recipe, "--no-closure"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("pip.yaml:4:") && stderr(&out).contains("asks for torch"),
        "{}",
        stderr(&out)
    );
}

/// `install --root DIR` installs over DIR's CPython (or --python-root's), not the host's, and
/// names DIR when it has none; it prints the venv's path whole.
#[test]
fn install_uses_the_roots_cpython_and_names_a_root_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let pylock = common::root().join("tests/fixtures/pylock.small.toml");
    let pylock = pylock.to_str().unwrap();
    let cache = common::stack::wheel_cache();
    let cache = cache.to_str().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = gpubake(&[
        "install",
        pylock,
        "--wheels",
        cache,
        "--root",
        empty.to_str().unwrap(),
    ]);
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains(&format!("{}: the base has no CPython", empty.display()))
            && stderr(&out).contains("--python-root"),
        "{}",
        stderr(&out)
    );
    assert!(!empty.join("opt").exists(), "nothing is installed");

    // A root with the closure's CPython 3.11 (its name is what is looked for).
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("usr/bin")).unwrap();
    std::fs::write(rootfs.join("usr/bin/python3.11"), "").unwrap();
    let out = gpubake(&[
        "install",
        pylock,
        "--wheels",
        cache,
        "--root",
        rootfs.to_str().unwrap(),
    ]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains(&format!(
            "into {}/opt/gpubake/venv over /usr/bin/python3.11",
            rootfs.display()
        )),
        "{}",
        stdout(&out)
    );
    // Into an empty directory over another root's CPython, as the rendered Dockerfile does.
    let stack = dir.path().join("stack");
    let out = gpubake(&[
        "install",
        pylock,
        "--wheels",
        cache,
        "--root",
        stack.to_str().unwrap(),
        "--python-root",
        rootfs.to_str().unwrap(),
        "--offline",
    ]);
    assert_exit(&out, 0);
    let cfg = std::fs::read_to_string(stack.join("opt/gpubake/venv/pyvenv.cfg")).unwrap();
    assert!(cfg.contains("/usr/bin"), "{cfg}");
}

/// A stack layer budget the plan cannot honour is refused before anything is built.
#[test]
fn a_stack_layer_budget_below_the_plans_floor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let to = format!("oci:{}:v1", dir.path().join("out").display());
    for n in ["0", "3"] {
        let out = gpubake(&["build", "--stack-layers", n, "--to", &to]);
        assert_exit(&out, 2);
        assert!(
            stderr(&out).contains("the stack takes at least 4 layers"),
            "{}",
            stderr(&out)
        );
    }
    assert!(!dir.path().join("out").exists());
}

/// Messages name what the user wrote: the second of two keys, a mapping rather than a Rust
/// type, a number too large rather than a bad requirement, the folder rather than a temporary
/// file, a path without `./` doubled.
#[test]
fn messages_name_what_the_user_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, text: &str, args: &[&str]| {
        let path = write(dir.path(), name, text);
        let mut all = vec![args[0], path.as_str()];
        all.extend(&args[1..]);
        let out = gpubake_in(dir.path(), &all);
        assert_exit(&out, 2);
        stderr(&out) + &stdout(&out)
    };
    let err = run(
        "dup.yaml",
        "name: a\nbase: x\nname: b\npytorch: '2.9'\n",
        &["resolve"],
    );
    assert!(
        err.contains("dup.yaml:3:1: duplicate field `name`"),
        "{err}"
    );
    let err = run("list.yaml", "- a\n- b\n", &["resolve"]);
    assert!(
        err.contains("expected a recipe: a mapping of its fields") && !err.contains("struct"),
        "{err}"
    );
    let err = run(
        "drv.yaml",
        "name: a\nbase: x\npytorch: '2.9'\ndriver: '>=99999999999999999999'\n",
        &["resolve"],
    );
    assert!(
        err.contains("too large for a version") && !err.contains("not a version requirement"),
        "{err}"
    );
    let missing = dir.path().join("no/such/Dockerfile");
    let err = run(
        "ok.yaml",
        "name: a\nbase: x\npytorch: '2.9'\n",
        &["render", "-o", missing.to_str().unwrap()],
    );
    assert!(
        err.contains(&format!(
            "{}: No such file",
            dir.path().join("no/such").display()
        )) && !err.contains(".gpubake-"),
        "{err}"
    );
    write(
        dir.path(),
        "nf.yaml",
        "name: a\nbase: x\npytorch: '2.9'\nfiles:\n  - {src: ./nonexistent, dest: /x}\n",
    );
    let out = gpubake_in(dir.path(), &["resolve", "./nf.yaml"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains(": ./nonexistent does not exist"),
        "{}",
        stderr(&out)
    );
    let bin = dir.path().join("nccl.conf");
    std::fs::write(&bin, [0x7f, b'E', b'L', b'F', 0xff, 0xfe, 0]).unwrap();
    let out = gpubake(&["lint", bin.to_str().unwrap()]);
    assert_exit(&out, 2);
    assert!(
        stdout(&out).contains("not UTF-8 text") && stdout(&out).contains("a UTF-8 text file"),
        "{}",
        stdout(&out)
    );
}

/// `build --lock` reads the file as a lock, and one that is empty, not YAML or not a lock
/// is refused at its file, line and field before anything is written.
#[test]
fn a_lock_that_is_empty_malformed_or_not_a_lock_is_refused_naming_it() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: t\nbase: debian:bookworm\npytorch: \"2.9\"\nsystem: [numactl]\n",
    );
    let from = common::from_base();
    for (name, text, said) in [
        ("empty.lock", "", "empty.lock: the file is empty"),
        ("bad.lock", "not: [valid\n", "bad.lock:1:1:"),
        (
            "other.lock",
            "{\"a\": 1}\n",
            "other.lock:1:2: field `a`: unknown field",
        ),
    ] {
        let lock = common::write(dir.path(), name, text);
        let args = common::build_args(&recipe, &from, "oci:./o:1", &["--lock", &lock]);
        let out = common::gpubake_in(dir.path(), &args);
        common::assert_exit(&out, 2);
        let err = common::stderr(&out);
        assert!(err.contains(said), "{name}: {err}");
        assert!(!dir.path().join("o").exists(), "{name}: nothing written");
    }
}

/// `build --timings` prints each phase and a line per layer it wrote, after the layers.
#[test]
fn build_timings_name_each_phase_and_each_layer_written() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "r.yaml", &recipe("pytorch: \"2.9\"\n"));
    let from = common::from_base();
    let args = common::build_args(&recipe, &from, "oci:./o:1", &["--timings", "--no-cache"]);
    let out = gpubake_in(dir.path(), &args);
    assert_exit(&out, 0);
    let text = stdout(&out);
    let at = text
        .find("timings (seconds)")
        .unwrap_or_else(|| panic!("{text}"));
    for phase in ["resolve", "base", "wheels", "layers", "transfer", "total"] {
        assert!(
            text[at..]
                .lines()
                .any(|l| l.trim_start().starts_with(phase)),
            "{phase}: {text}"
        );
    }
    // Every layer has a line saying where it came from; --no-cache writes the probe and
    // presets layers, so theirs say so and carry their times.
    let table = &text[at
        + text[at..]
            .find("\n  layer ")
            .unwrap_or_else(|| panic!("{text}"))..];
    for layer in ["probe", "presets"] {
        assert!(
            table.lines().any(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                words.len() > 2 && words[0] == layer && words[1] == "written"
            }),
            "{layer}: {text}"
        );
    }
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["base", "base"])),
        "{text}"
    );
    let plain = gpubake_in(
        dir.path(),
        &common::build_args(&recipe, &from, "oci:./o:1", &[]),
    );
    assert!(!stdout(&plain).contains("timings"), "{}", stdout(&plain));
}

/// `lint --help` says which exit code is which: 1 for a finding that is an error, 2 for a
/// file it cannot read as a recipe, preset or nccl.conf, as an unknown preset or field is
/// (issue 40, finding 8).
#[test]
fn lint_help_names_each_exit_code_and_lint_keeps_to_it() {
    let help = stdout(&gpubake(&["lint", "--help"]));
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("1 when a") && help.contains("2 when a file cannot be read"),
        "{help}"
    );
    assert!(
        help.contains("an unknown field") && help.contains("a preset that does not exist"),
        "{help}"
    );
    let dir = tempfile::tempdir().unwrap();
    let preset = write(
        dir.path(),
        "preset.yaml",
        "name: t\nbase: x\npytorch: '2.9'\npresets: [base, nvlnk]\n",
    );
    assert_exit(&gpubake(&["lint", &preset]), 2);
    let field = write(
        dir.path(),
        "field.yaml",
        &recipe("pytorch: '2.9'\nsytem: [numactl]\n"),
    );
    assert_exit(&gpubake(&["lint", &field]), 2);
    let error = write(
        dir.path(),
        "error.yaml",
        &recipe("pytorch: '2.9'\nenv: {NCCL_NTHREADS: '1000'}\n"),
    );
    assert_exit(&gpubake(&["lint", &error]), 1);
}

/// A mistyped field gets the field meant, and the list of fields once; a mistyped preset
/// names the recipe once, at the place it is named (issue 40, finding 9).
#[test]
fn a_mistyped_field_or_preset_is_named_once_with_what_was_meant() {
    let dir = tempfile::tempdir().unwrap();
    let field = write(dir.path(), "field.yaml", &recipe("sytem: [numactl]\n"));
    let out = gpubake(&["resolve", &field, "--no-closure"]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(err.contains("did you mean `system`"), "{err}");
    assert_eq!(err.matches("platforms").count(), 1, "{err}");

    let nested = write(
        dir.path(),
        "nested.yaml",
        "description: x\nenv:\n  NCCL_DEBUG: {value: WARN, reasn: x}\n",
    );
    let out = gpubake(&["lint", &nested]);
    let text = stdout(&out);
    assert!(text.contains("did you mean `reason`"), "{text}");
    assert!(!text.contains("expected one of"), "{text}");

    let preset = write(
        dir.path(),
        "preset.yaml",
        "name: t\nbase: x\npytorch: '2.9'\npresets: [base, nvlnk]\n",
    );
    let text = stdout(&gpubake(&["lint", &preset]));
    let line = text.lines().next().unwrap();
    assert_eq!(line.matches("preset.yaml").count(), 1, "{text}");
    assert!(
        line.contains("preset.yaml:4:") && line.contains("did you mean `nvlink`"),
        "{text}"
    );
}

/// A certificate refused for its verdict names the checks that failed (issue 40, finding 9).
#[test]
fn a_refused_certificate_names_the_failed_check() {
    let digest = format!("sha256:{}", "1".repeat(64));
    let certificate = serde_json::json!({
        "facts": {"manifest": digest, "scope": {"level": "static", "gpus": "none"}},
        "checks": [
            {"name": "manifest", "status": "PASS", "detail": "ok"},
            {"name": "NCCL preset lint", "status": "FAIL", "detail": "NCCL_NTHREADS: 1000"},
        ],
    });
    let why = gpubake::certify::judge_certificate(&certificate, Some("failed"), &digest, true)
        .unwrap_err();
    assert!(
        why.contains("its verdict is failed") && why.contains("NCCL preset lint: NCCL_NTHREADS"),
        "{why}"
    );
}

/// The probe's report ends with a verdict line, as certify's does; a file it cannot write
/// is named by the flag that asked for it, and said before the probe runs (issue 40,
/// findings 9 and 10).
#[test]
fn the_probe_ends_with_its_verdict_and_names_the_flag_of_a_file_it_cannot_write() {
    let out = gpubake(&[
        "probe",
        "--emit",
        "prometheus:/nonexistent/gpu.prom",
        "--junit",
        "/nonexistent/probe.xml",
    ]);
    let text = stdout(&out);
    let last = text.lines().last().unwrap_or_default();
    assert!(last.starts_with("verdict: "), "{text}");
    let err = stderr(&out);
    for flag in [
        "--emit prometheus:/nonexistent/gpu.prom: ",
        "--junit /nonexistent/probe.xml: ",
    ] {
        assert_eq!(err.matches(flag).count(), 2, "{flag}: {err}");
    }
    assert!(
        err.starts_with("warning: ") && err.contains("does not exist"),
        "{err}"
    );
}

/// `presets show` says when a local file takes the place of a built-in preset, as resolve
/// does (issue 40, finding 10).
#[test]
fn presets_show_says_a_local_preset_shadows_the_builtin() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "env-presets/base.yaml",
        "description: local\nenv:\n  NCCL_DEBUG: {value: INFO, reason: loud}\n",
    );
    let out = gpubake_in(dir.path(), &["presets", "show", "base"]);
    assert_exit(&out, 0);
    let err = stderr(&out);
    assert!(
        err.contains("preset `base` is read from env-presets/base.yaml")
            && err.contains("takes the place of the built-in preset"),
        "{err}"
    );
}

/// The unconfirmed driver floor is said where it matters, with how to settle it, and not
/// to a recipe whose fleet floor is on a later branch (issue 40, finding 10).
#[test]
fn the_unconfirmed_driver_floor_warning_is_settled_by_a_fleet_floor() {
    let dir = tempfile::tempdir().unwrap();
    let without = write(dir.path(), "without.yaml", &recipe("pytorch: '2.9'\n"));
    let err = stderr(&gpubake(&["resolve", &without, "--no-closure"]));
    assert!(
        err.contains("driver floor 525.60.13") && err.contains("--driver"),
        "{err}"
    );
    let err = stderr(&gpubake(&[
        "resolve",
        &without,
        "--no-closure",
        "--driver",
        "570.86",
    ]));
    assert!(!err.contains("driver floor"), "{err}");
    let fleet = write(
        dir.path(),
        "fleet.yaml",
        &recipe("pytorch: '2.9'\ndriver: '>=550'\n"),
    );
    let err = stderr(&gpubake(&["resolve", &fleet, "--no-closure"]));
    assert!(!err.contains("driver floor"), "{err}");
}

/// `build --help` says that --key also signs the manifest of a docker:// image (issue 40,
/// finding 10).
#[test]
fn build_help_says_key_also_signs_the_manifest() {
    let help = stdout(&gpubake(&["build", "--help"]));
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("--key <KEY>") && words.contains("and sign the image's manifest"),
        "{help}"
    );
}

/// `built … in N s` counts from the command's start, resolution included: the total of
/// --timings (issue 40, finding 10).
#[test]
fn the_built_line_counts_resolution_too() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "r.yaml", &recipe("pytorch: \"2.9\"\n"));
    let from = common::from_base();
    let args = common::build_args(&recipe, &from, "oci:./o:1", &["--timings"]);
    let out = gpubake_in(dir.path(), &args);
    assert_exit(&out, 0);
    let text = stdout(&out);
    let built = text
        .lines()
        .find_map(|l| l.strip_prefix("built oci:./o:1 in "))
        .and_then(|rest| rest.strip_suffix(" s"))
        .unwrap_or_else(|| panic!("{text}"));
    let total = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("total"))
        .map(str::trim)
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(built, total, "{text}");
}

/// A build to a registry that does not answer fails before anything else is read or built,
/// and speaks of connecting, not of a login nobody set up (issue 40, finding 9).
#[test]
fn a_build_to_a_registry_that_is_down_fails_first_without_speaking_of_a_login() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(dir.path(), "r.yaml", &recipe("pytorch: '2.9'\n"));
    let to = format!("docker://127.0.0.1:{port}/app:v1");
    // The base does not exist: a build that went on before asking the registry would fail
    // on the base, exit 2.
    let out = gpubake_in(
        dir.path(),
        &common::build_args(&recipe, "oci:./no-base:latest", &to, &[]),
    );
    assert_exit(&out, 3);
    let err = stderr(&out);
    assert!(
        err.contains("the registry did not answer") && err.contains("no login is set up"),
        "{err}"
    );
    assert!(!err.contains("logging in"), "{err}");
}

/// A start-up record that cannot order this build's layers is refused before anything is
/// resolved over the network or written: without eStargz, an empty one, one of another torch.
#[test]
fn a_startup_record_that_cannot_order_the_layers_is_refused_first() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let to = format!("oci:{}:v1", out_dir.display());
    let record = |name: &str, torch: &str, files: &str| {
        write(
            dir.path(),
            name,
            &format!(
                "{{\"format\": \"gpubake-startup-record/1\", \"torch\": \"{torch}\", \
                 \"python\": \"3.12.3\", \"steps\": [\"import torch\"],\n\"files\": [{files}]}}\n"
            ),
        )
    };
    let one = r#"{"path": "site-packages/torch/__init__.py", "size": 9, "read": 9}"#;
    let h200 = record("h200.json", "2.11.0+cu130", one);
    let empty = record("empty.json", "2.9.1+cu128", "");
    let cases: [(&[&str], &[&str]); 3] = [
        (
            &["--startup-record", &h200],
            &[
                "--startup-record orders lazily pulled layers",
                "--compression estargz or zstd:chunked",
            ],
        ),
        (
            &["--startup-record", &empty, "--compression", "estargz"],
            &["empty.json", "files", "is empty"],
        ),
        (
            &["--startup-record", &h200, "--compression", "estargz"],
            &["h200.json", "torch", "2.11.0+cu130", "2.9.1+cu128"],
        ),
    ];
    let from = common::from_base();
    for (args, said) in cases {
        let mut all = vec!["build", "--from", &from, "--to", &to];
        all.extend_from_slice(args);
        let out = gpubake(&all);
        assert_exit(&out, 2);
        let err = stderr(&out);
        for s in said {
            assert!(err.contains(s), "{args:?}: no {s:?} in\n{err}");
        }
    }
    assert!(!out_dir.exists());
}
