//! The linter over real files: bad presets and config files are caught at the right line,
//! and every shipped recipe and preset lints clean.

mod common;

use common::{assert_exit, gpubake, stdout};
use gpubake::lint::{Context, Severity, check_var};
use serde_json::Value;

/// Runs `gpubake lint --json FILE` and returns (exit code, findings as (line, code, var)).
fn lint(file: &str, extra: &[&str]) -> (i32, Vec<(u64, String, String)>) {
    let mut args = vec!["lint", "--json", file];
    args.extend(extra);
    let out = gpubake(&args);
    let report: Value = serde_json::from_str(&stdout(&out)).expect("lint --json prints JSON");
    let findings = report["files"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["line"].as_u64().unwrap_or(0),
                f["code"].as_str().unwrap().to_string(),
                f["var"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    (out.status.code().unwrap(), findings)
}

/// Runs `gpubake lint --json` on each file and returns every finding as JSON.
fn findings(files: &[&str], extra: &[&str]) -> (i32, Vec<Value>) {
    let mut args = vec!["lint", "--json"];
    args.extend(extra);
    args.extend(files);
    let out = gpubake(&args);
    let report: Value = serde_json::from_str(&stdout(&out)).expect("lint --json prints JSON");
    let all = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["findings"].as_array().unwrap().clone())
        .collect();
    (out.status.code().unwrap(), all)
}

/// The one finding with `code` on `line`, as JSON.
fn the<'a>(findings: &'a [Value], line: u64, code: &str) -> &'a Value {
    let found: Vec<&Value> = findings
        .iter()
        .filter(|f| f["line"] == line && f["code"] == code)
        .collect();
    assert_eq!(found.len(), 1, "{code} on line {line}: {findings:#?}");
    found[0]
}

fn codes(name: &str, value: &str) -> Vec<&'static str> {
    check_var(name, value, &Context::default())
        .into_iter()
        .map(|i| i.code)
        .collect()
}

fn has(findings: &[(u64, String, String)], line: u64, code: &str, var: &str) -> bool {
    findings
        .iter()
        .any(|(l, c, v)| *l == line && c == code && v == var)
}

#[test]
fn typos_are_errors_at_the_key() {
    let (code, f) = lint("tests/fixtures/lint/typos.yaml", &[]);
    assert_eq!(code, 1);
    assert!(has(&f, 3, "unknown-name", "NCCL_P2P_DISABLED"), "{f:?}");
    assert!(has(&f, 6, "unknown-name", "NCCL_NTHREAD"), "{f:?}");
    assert!(has(&f, 9, "unknown-name", "nccl_debug"), "{f:?}");
    let out = gpubake(&["lint", "tests/fixtures/lint/typos.yaml"]);
    assert!(
        stdout(&out).contains("did you mean NCCL_P2P_DISABLE?"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn out_of_range_and_misparsed_values() {
    let (code, f) = lint("tests/fixtures/lint/values.yaml", &[]);
    assert_eq!(code, 1);
    assert!(has(&f, 6, "out-of-range", "NCCL_NTHREADS"), "{f:?}");
    assert!(has(&f, 9, "not-a-multiple", "NCCL_LL128_NTHREADS"), "{f:?}");
    assert!(has(&f, 12, "not-a-number", "NCCL_IB_DISABLE"), "{f:?}");
    assert!(has(&f, 15, "trailing-text", "NCCL_BUFFSIZE"), "{f:?}");
    assert!(has(&f, 18, "octal", "NCCL_IB_QPS_PER_CONNECTION"), "{f:?}");
    assert!(has(&f, 21, "case", "NCCL_P2P_LEVEL"), "{f:?}");
    assert!(has(&f, 24, "unknown-value", "NCCL_DEBUG"), "{f:?}");
    let out = gpubake(&["lint", "tests/fixtures/lint/values.yaml"]);
    assert!(
        stdout(&out).contains("NCCL takes plain byte counts: write 8388608"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn removed_and_too_new_variables() {
    let (code, f) = lint("tests/fixtures/lint/removed.yaml", &[]);
    assert_eq!(code, 1);
    assert!(has(&f, 5, "removed", "NCCL_LL_THRESHOLD"), "{f:?}");
    assert!(has(&f, 8, "removed", "NCCL_IB_GDR_LEVEL"), "{f:?}");
    assert!(has(&f, 11, "too-new", "NCCL_CHECK_MODE"), "{f:?}");
    // Against a new enough NCCL, the too-new warning goes away.
    let (_, f) = lint("tests/fixtures/lint/removed.yaml", &["--nccl", "2.30.7"]);
    assert!(!f.iter().any(|(_, c, _)| c == "too-new"), "{f:?}");
}

#[test]
fn list_syntax_errors() {
    let (code, f) = lint("tests/fixtures/lint/lists.yaml", &[]);
    assert_eq!(code, 1);
    assert!(has(&f, 6, "empty-entry", "NCCL_ALGO"), "{f:?}");
    assert!(has(&f, 9, "list-syntax", "NCCL_PROTO"), "{f:?}");
    assert!(has(&f, 12, "unknown-value", "NCCL_DEBUG_SUBSYS"), "{f:?}");
    // The same per-function list is fine from 2.24 on, apart from its risk warning.
    let (_, f) = lint("tests/fixtures/lint/lists.yaml", &["--nccl", "2.24.3"]);
    assert!(
        f.iter()
            .filter(|(l, _, _)| *l == 9)
            .all(|(_, c, _)| c == "production-risk" || c == "list-syntax"),
        "{f:?}"
    );
}

#[test]
fn nccl_conf_files_are_linted_line_by_line() {
    let (code, f) = lint("tests/fixtures/lint/nccl.conf", &[]);
    assert_eq!(code, 0, "warnings alone pass without --strict");
    assert!(has(&f, 2, "production-risk", "NCCL_DEBUG"), "{f:?}");
    assert!(has(&f, 3, "out-of-range", "NCCL_SOCKET_NTHREADS"), "{f:?}");
    assert!(
        f.iter().any(|(l, c, _)| *l == 4 && c == "no-equals"),
        "{f:?}"
    );
    let out = gpubake(&["lint", "--strict", "tests/fixtures/lint/nccl.conf"]);
    assert_exit(&out, 1);
}

#[test]
fn shipped_recipes_and_presets_lint_clean() {
    let mut args = vec!["lint".to_string(), "--strict".to_string()];
    for dir in ["recipes", "env-presets"] {
        for entry in std::fs::read_dir(common::root().join(dir)).unwrap() {
            args.push(format!(
                "{dir}/{}",
                entry.unwrap().file_name().to_string_lossy()
            ));
        }
    }
    assert!(args.len() >= 2 + 5 + 6, "{args:?}");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = gpubake(&args);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains("0 errors, 0 warnings"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn recipe_lint_points_into_the_preset_that_set_the_value() {
    let dir = tempfile::tempdir().unwrap();
    common::write(
        dir.path(),
        "env-presets/fast.yaml",
        "description: x\nenv:\n  NCCL_NTHREADS:\n    value: '100'\n    reason: guess\n",
    );
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        &common::recipe("pytorch: '2.9'\npresets: [fast]\n"),
    );
    let out = common::gpubake_in(dir.path(), &["lint", &recipe]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    assert!(
        text.contains("env-presets/fast.yaml:4:12: error[not-a-multiple]"),
        "{text}"
    );
    assert!(text.contains("(merged into"), "{text}");
}

#[test]
fn allowed_warnings_are_silenced_but_errors_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let p = common::write(
        dir.path(),
        "p.yaml",
        "description: x\nrequires: {nccl: '>=2.27'}\nenv:\n  NCCL_ALGO:\n    value: Ring\n    reason: test\n    allow: [production-risk]\n",
    );
    assert_exit(&gpubake(&["lint", "--strict", &p]), 0);
    let bad = common::write(
        dir.path(),
        "q.yaml",
        "description: x\nenv:\n  NCCL_ALGO:\n    value: Ring\n    reason: test\n    allow: [everything]\n",
    );
    let out = gpubake(&["lint", &bad]);
    assert_exit(&out, 2);
    assert!(stdout(&out).contains("q.yaml:6:"), "{}", stdout(&out));
}

#[test]
fn nccl_conf_is_read_the_way_nccl_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let conf = common::write(
        dir.path(),
        "nccl.conf",
        "# site settings\n\
         export NCCL_P2P_DISABLE=1\n\
         \x20 NCCL_IB_TIMEOUT=22\n\
         NCCL_DEBUG = WARN\n\
         NCCL_SOCKET_IFNAME=eth0 # bootstrap\n\
         NCCL_CROSS_NIC=0\n\
         NCCL_CROSS_NIC=1\n\
         \x20  # an indented comment\n\
         NCCL_IB_RETRY_CNT=7 # the most IB allows\n",
    );
    let (code, f) = findings(&[&conf], &[]);
    assert_eq!(code, 1, "{f:#?}");
    let export = the(&f, 2, "export");
    assert!(
        export["message"]
            .as_str()
            .unwrap()
            .contains("`export NCCL_P2P_DISABLE`"),
        "{export}"
    );
    assert_eq!(export["help"], "write `NCCL_P2P_DISABLE=1`");
    assert_eq!(export["column"], 1);
    let leading = the(&f, 3, "name-spaces");
    assert!(
        leading["message"]
            .as_str()
            .unwrap()
            .contains("`  NCCL_IB_TIMEOUT`"),
        "{leading}"
    );
    let spaced = the(&f, 4, "name-spaces");
    let text = spaced["message"].as_str().unwrap();
    assert!(
        text.contains("`NCCL_DEBUG `") && !text.contains("did you mean"),
        "{text}"
    );
    assert_eq!(spaced["help"], "write `NCCL_DEBUG=WARN`");
    let comment = the(&f, 5, "inline-comment");
    assert_eq!(comment["severity"], "error");
    assert!(
        comment["message"]
            .as_str()
            .unwrap()
            .contains("`eth0 # bootstrap`"),
        "{comment}"
    );
    let duplicate = the(&f, 7, "duplicate");
    assert!(
        duplicate["message"]
            .as_str()
            .unwrap()
            .contains("already set on line 6 (`0`): NCCL keeps that first value"),
        "{duplicate}"
    );
    // strtoll stops at the space, so the number still reads as 7.
    let number = the(&f, 9, "inline-comment");
    assert_eq!(number["severity"], "warning");
    assert!(
        number["message"]
            .as_str()
            .unwrap()
            .contains("reads the number 7"),
        "{number}"
    );
    assert!(!f.iter().any(|x| x["line"] == 8), "{f:#?}");
}

#[test]
fn crlf_nccl_conf_is_flagged_for_releases_that_keep_the_cr() {
    let dir = tempfile::tempdir().unwrap();
    let conf = common::write(
        dir.path(),
        "nccl.conf",
        "NCCL_DEBUG=WARN\r\nNCCL_IB_TIMEOUT=22\r\n",
    );
    let (_, f) = findings(&[&conf], &["--nccl", "2.27.5"]);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(the(&f, 1, "crlf")["severity"], "error");
    let (_, f) = findings(&[&conf], &[]);
    assert_eq!(the(&f, 1, "crlf")["severity"], "warning");
    // 2.30.3 and later drop the `\r` themselves.
    let (code, f) = findings(&[&conf], &["--nccl", "2.30.7"]);
    assert_eq!((code, f.len()), (0, 0), "{f:#?}");
}

#[test]
fn path_level_numbers_say_which_level_they_mean() {
    for number in ["5", "9"] {
        let issues = check_var("NCCL_NET_GDR_LEVEL", number, &Context::default());
        let legacy = issues
            .iter()
            .find(|i| i.code == "legacy-level")
            .unwrap_or_else(|| panic!("{number}: {issues:?}"));
        assert!(
            legacy
                .message
                .contains(&format!("NCCL_NET_GDR_LEVEL={number} means SYS")),
            "{}",
            legacy.message
        );
        assert_eq!(legacy.help.as_deref(), Some("write SYS"));
        // SYS is the risky level, however it is written.
        assert!(issues.iter().any(|i| i.code == "production-risk"));
    }
    let one = check_var("NCCL_P2P_LEVEL", "1", &Context::default());
    assert!(one[0].message.contains("means PIX"), "{one:?}");
    assert_eq!(codes("NCCL_P2P_LEVEL", "PXB"), Vec::<&str>::new());
    assert!(codes("NCCL_P2P_LEVEL", " NVL").contains(&"unknown-value"));
}

#[test]
fn exact_lists_and_defaults_are_no_risk() {
    assert!(codes("NCCL_IB_HCA", "=mlx5_0,mlx5_1").is_empty());
    assert!(codes("NCCL_IB_HCA", "^=mlx5_2:1").is_empty());
    assert!(codes("NCCL_IB_HCA", "mlx5_0,mlx5_1").contains(&"production-risk"));
    // `=` counts only at the start of the whole list.
    assert!(codes("NCCL_IB_HCA", "mlx5_0,=mlx5_1").contains(&"list-syntax"));
    assert!(codes("NCCL_BUFFSIZE", "4194304").is_empty());
    assert!(codes("NCCL_BUFFSIZE", "0x400000").is_empty());
    assert!(codes("NCCL_BUFFSIZE", "8388608").contains(&"production-risk"));
    let risk = check_var("NCCL_DEBUG", "INFO", &Context::default());
    assert!(risk[0].help.is_some(), "{risk:?}");
}

#[test]
fn pytorch_names_point_at_their_torch_spelling() {
    for (old, new) in [
        (
            "NCCL_ASYNC_ERROR_HANDLING",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        ),
        ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"),
    ] {
        let issues = check_var(old, "1", &Context::default());
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(
            (issues[0].code, issues[0].severity),
            ("torch-name", Severity::Warning)
        );
        assert!(issues[0].message.contains("PyTorch"), "{issues:?}");
        assert_eq!(issues[0].help, Some(format!("write {new}")));
        assert!(check_var(new, "1", &Context::default()).is_empty());
    }
}

#[test]
fn presets_with_pytorch_names() {
    let dir = tempfile::tempdir().unwrap();
    let preset = common::write(
        dir.path(),
        "p.yaml",
        "description: x\nrequires: {nccl: '>=2.27'}\nenv:\n  NCCL_BLOCKING_WAIT: {value: '1', reason: old}\n  TORCH_NCCL_ASYNC_ERROR_HANDLING: {value: '1', reason: new}\n",
    );
    let (code, f) = findings(&[&preset], &[]);
    assert_eq!(code, 0, "{f:#?}");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(
        the(&f, 4, "torch-name")["help"],
        "write TORCH_NCCL_BLOCKING_WAIT"
    );
    // The shipped base preset uses PyTorch's current name.
    let base = std::fs::read_to_string(common::root().join("env-presets/base.yaml")).unwrap();
    assert!(base.contains("TORCH_NCCL_ASYNC_ERROR_HANDLING:"));
    assert_eq!(
        check_var("NCCL_BLOCKING_WAIT", "1", &Context::default())[0].severity,
        Severity::Warning
    );
}

#[test]
fn nvlink_settings_are_checked_against_the_recipe_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = |name: &str, gpus: &str| {
        common::write(
            dir.path(),
            name,
            &common::recipe(&format!(
                "pytorch: '2.9'\ngpus: [{gpus}]\npresets: [base, nvlink]\n"
            )),
        )
    };
    let l40s = recipe("l40s.yaml", "l40s");
    let out = common::gpubake_in(dir.path(), &["lint", &l40s]);
    assert_exit(&out, 1);
    let text = stdout(&out);
    assert!(
        text.contains("env-presets/nvlink.yaml:7:12: error[no-nvlink]: l40s has no NVLink"),
        "{text}"
    );
    assert!(text.contains("SHM"), "{text}");
    let a100 = recipe("a100.yaml", "a100-pcie");
    let (code, f) = findings(&[&a100], &[]);
    assert_eq!(code, 0, "{f:#?}");
    assert!(f.iter().any(|x| x["code"] == "nvlink-bridge"), "{f:#?}");
    let h100 = recipe("h100.yaml", "h100");
    let (code, f) = findings(&[&h100], &["--strict"]);
    assert_eq!((code, f.len()), (0, 0), "{f:#?}");
}

#[test]
fn an_unknown_nccl_pin_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        &common::recipe("pytorch: '2.5'\ncuda: '11.8'\npresets: [base]\n"),
    );
    let (code, f) = findings(&[&recipe], &[]);
    assert_eq!(code, 0, "{f:#?}");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0]["code"], "unknown-nccl");
    assert_eq!(f[0]["severity"], "warning");
}

/// What `certify` would fail an image for is found at lint time: a secret in `env:`, and
/// presets that answer one question two ways.
#[test]
fn secrets_and_contradicting_presets_are_lint_errors() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: r\nbase: x\npytorch: '2.9'\npresets: [base]\nenv:\n  AWS_SECRET_ACCESS_KEY: abc\n",
    );
    let (code, findings) = lint(&recipe, &[]);
    assert_eq!(code, 1, "{findings:?}");
    assert!(
        findings.contains(&(6, "secret".into(), "AWS_SECRET_ACCESS_KEY".into())),
        "{findings:?}"
    );
    let recipe = common::write(
        dir.path(),
        "two.yaml",
        "name: r\nbase: x\npytorch: '2.9'\npresets: [nvlink, pcie]\n",
    );
    let (code, findings) = lint(&recipe, &[]);
    assert_eq!(code, 1, "{findings:?}");
    assert!(
        findings.contains(&(4, "preset-conflict".into(), String::new())),
        "{findings:?}"
    );
    let out = gpubake(&["lint", &recipe]);
    assert!(
        stdout(&out).contains(
            "NCCL_P2P_LEVEL=NVL (preset nvlink) against NCCL_P2P_LEVEL=PXB (preset pcie)"
        ),
        "{}",
        stdout(&out)
    );
    // The recipe's own `env:` settles it.
    let recipe = common::write(
        dir.path(),
        "settled.yaml",
        "name: r\nbase: x\npytorch: '2.9'\npresets: [nvlink, pcie]\nenv: {NCCL_P2P_LEVEL: PXB}\n",
    );
    let (_, findings) = lint(&recipe, &[]);
    assert!(
        !findings.iter().any(|f| f.1 == "preset-conflict"),
        "{findings:?}"
    );
    // A preset over the one it extends, and the debug overlay, override on purpose.
    let recipe = common::write(
        dir.path(),
        "fine.yaml",
        "name: r\nbase: x\npytorch: '2.9'\npresets: [base, nvlink, debug]\n",
    );
    let (_, findings) = lint(&recipe, &[]);
    assert!(
        !findings.iter().any(|f| f.1 == "preset-conflict"),
        "{findings:?}"
    );
}

/// Variables gpubake sets itself are refused where a recipe writes them, by `lint` and
/// `resolve` alike, before any build path picks a winner.
#[test]
fn variables_gpubake_owns_are_refused_in_recipes_at_lint_and_resolve() {
    let dir = tempfile::tempdir().unwrap();
    for key in [
        "PATH",
        "NVIDIA_VISIBLE_DEVICES",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
    ] {
        let recipe = common::write(
            dir.path(),
            "owned.yaml",
            &format!("name: r\nbase: x\npytorch: '2.9'\nenv:\n  {key}: /x\n"),
        );
        let out = gpubake(&["lint", &recipe]);
        assert_exit(&out, 2);
        assert!(
            stdout(&out).contains("owned.yaml:5:3: error[invalid-input]: field `env.")
                && stdout(&out).contains(&format!("`{key}` is set by gpubake")),
            "{}",
            stdout(&out)
        );
        let out = gpubake(&["resolve", &recipe]);
        assert_exit(&out, 2);
        assert!(
            common::stderr(&out).contains("owned.yaml:5:3")
                && common::stderr(&out).contains(&format!("`{key}` is set by gpubake")),
            "{}",
            common::stderr(&out)
        );
    }
}

/// A preset's `allow:` travels with its value into the lock and the nccl.conf the image bakes
/// from it: lint of the recipe and lint of that file give one answer (issue 40, finding 6).
#[test]
fn a_presets_allowance_holds_in_the_nccl_conf_baked_from_the_lock() {
    use gpubake::recipe::LoadedRecipe;
    use gpubake::resolve::{Options, resolve_recipe};
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "ib.yaml",
        "name: ib\nbase: debian:bookworm\npytorch: '2.9'\npresets: [base, infiniband]\n\
         system: [libibverbs1, ibverbs-providers]\n",
    );
    let (code, findings) = lint(&recipe, &[]);
    assert_eq!((code, findings.len()), (0, 0), "{findings:?}");

    let loaded = LoadedRecipe::read(std::path::Path::new(&recipe)).unwrap();
    let lock = resolve_recipe(&loaded, &Options::default()).unwrap().lock;
    assert!(
        lock.to_yaml().contains("allow:\n    - production-risk"),
        "{}",
        lock.to_yaml()
    );
    let conf = lock.env.nccl_conf();
    // NCCL reads nothing of the allowance: the line starts with `#` and has no `=`.
    assert!(
        conf.contains("# gpubake allow NCCL_NET: production-risk\nNCCL_NET=IB\n"),
        "{conf}"
    );
    let baked = common::write(dir.path(), "nccl.conf", &conf);
    let (code, findings) = lint(&baked, &["--nccl", "2.27.5"]);
    assert_eq!((code, findings.len()), (0, 0), "{findings:?}");

    // Without the comment, the same setting is warned of; a comment cannot allow an error.
    let bare = common::write(dir.path(), "bare.conf", "NCCL_NET=IB\n");
    let (_, findings) = lint(&bare, &[]);
    assert!(
        findings
            .iter()
            .any(|(_, code, var)| code == "production-risk" && var == "NCCL_NET"),
        "{findings:?}"
    );
    let error = common::write(
        dir.path(),
        "error.conf",
        "# gpubake allow NCCL_NTHREADS: production-risk, out-of-range\nNCCL_NTHREADS=1024\n",
    );
    let (code, findings) = lint(&error, &[]);
    assert_eq!(code, 1, "{findings:?}");
    assert!(findings.iter().any(|(_, code, _)| code == "out-of-range"));
}
