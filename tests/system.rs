//! System packages in real images: a recipe's `system:` resolved against a real Debian
//! bookworm base from Debian's archive, unpacked into a layer without apt, dpkg or a
//! container, and then run by the Docker Engine, where the image's own dpkg, apt and
//! dynamic loader judge what was written.

mod common;

use common::{assert_exit, gpubake, stderr, stdout, write};
use std::path::Path;
use std::process::Command;

const ASKED: &str = "[rdma-core, ibverbs-providers, ibverbs-utils, numactl, openssh-client]";

/// A recipe of `system` packages; with rdma-core, udev (which it needs) has its hardware
/// database skipped, as a container has none.
fn recipe(dir: &Path, system: &str) -> String {
    let scripts = if system.contains("rdma-core") {
        "system_scripts:\n  udev: {skip: \"the hardware database is the host's\"}\n"
    } else {
        ""
    };
    write(
        dir,
        "r.yaml",
        &format!(
            "name: sys-test\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
             presets: [base]\nsystem: {system}\n{scripts}"
        ),
    )
}

fn docker_run(image: &str, script: &str) -> (bool, String) {
    let out = Command::new("docker")
        .args(["run", "--rm", image, "sh", "-c", script])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `build --without-python` of `recipe` on `base` to `to`, with `extra` flags; its JSON report.
fn build(recipe: &str, base: &Path, to: &str, lock: &Path, extra: &[&str]) -> serde_json::Value {
    let from = format!("oci:{}:bookworm", base.display());
    let lock = lock.display().to_string();
    let mut args = vec![
        "build",
        "--without-python",
        recipe,
        "--from",
        &from,
        "--to",
        to,
    ];
    args.extend(["--lock-out", &lock, "--json"]);
    args.extend(extra);
    let out = gpubake(&args);
    assert_exit(&out, 0);
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn system_packages_install_without_a_daemon_and_dpkg_apt_and_the_loader_see_them() {
    let Some(base) = common::debian_base() else {
        return;
    };
    if !common::have("docker", "version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path(), ASKED);
    let lock_path = dir.path().join("lock.yaml");
    let first = build(
        &recipe,
        &base,
        &format!("oci:{}:v1", dir.path().join("a").display()),
        &lock_path,
        &[],
    );
    // The second build makes every layer again (the OS layer's scripts and loader cache
    // settled anew), and gets the same bytes.
    let second = build(
        &recipe,
        &base,
        &format!("oci:{}:v1", dir.path().join("b").display()),
        &dir.path().join("lock2.yaml"),
        &["--no-cache"],
    );
    assert_eq!(
        first["manifest"], second["manifest"],
        "two builds, one digest"
    );

    let lock: serde_yaml::Value =
        serde_yaml::from_slice(&std::fs::read(&lock_path).unwrap()).unwrap();
    let pins: Vec<(String, String)> = lock["system"]
        .as_sequence()
        .expect("the lock pins the system packages")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["version"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for asked in [
        "rdma-core",
        "ibverbs-providers",
        "ibverbs-utils",
        "numactl",
        "openssh-client",
    ] {
        assert!(pins.iter().any(|(n, _)| n == asked), "{asked} in {pins:?}");
    }

    let tag = "gpubake-system-test:v1";
    let out = gpubake(&[
        "copy",
        &format!("oci:{}:v1", dir.path().join("a").display()),
        &format!("docker-daemon:{tag}"),
    ]);
    assert_exit(&out, 0);
    // The tools run, their libraries found by the image's own loader.
    for script in ["numactl --show", "ssh -V"] {
        let (ok, text) = docker_run(tag, script);
        assert!(ok, "{script}: {text}");
    }
    // ibv_devinfo runs and libibverbs answers; on a machine without RDMA devices (no
    // /sys/class/infiniband, as here and in CI) the kernel has no verbs to offer, which it
    // says, and a node with a ConnectX lists its devices.
    let (ok, text) = docker_run(tag, "ibv_devinfo -l");
    assert!(
        ok || text.contains("Failed to get IB devices list: Function not implemented"),
        "{text}"
    );
    assert!(
        !text.contains("error while loading shared libraries"),
        "{text}"
    );
    // NCCL's IB transport dlopens libibverbs.so.1; so does this.
    let (ok, text) = docker_run(
        tag,
        "python3 -c 'import ctypes; ctypes.CDLL(\"libibverbs.so.1\"); print(\"loaded\")'",
    );
    assert!(ok && text.contains("loaded"), "{text}");
    // dpkg lists every pinned package at the locked version, installed.
    let (ok, listed) = docker_run(
        tag,
        "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n'",
    );
    assert!(ok, "{listed}");
    for (name, version) in &pins {
        assert!(
            listed
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == [name.as_str(), version, "ii"]),
            "{name} {version} not installed: {listed}"
        );
    }
    // dpkg -L knows each package's files; dpkg's audit and apt's check find nothing wrong.
    let (ok, files) = docker_run(tag, "dpkg -L numactl");
    assert!(
        ok && files.lines().any(|l| l == "/usr/bin/numactl"),
        "{files}"
    );
    let (ok, text) = docker_run(tag, "dpkg --audit && apt-get check");
    assert!(ok && !text.contains("E:"), "{text}");
    // On the merged-/usr base the links stay links: the packages' /bin and /lib went
    // through them.
    let (ok, text) = docker_run(
        tag,
        "test -L /bin && test -L /lib && test -L /lib64 && echo links",
    );
    assert!(ok && text.contains("links"), "{text}");
    let _ = Command::new("docker").args(["rmi", "-f", tag]).output();
}

#[test]
fn a_base_without_dpkg_is_refused_at_the_field() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path(), "[numactl]");
    let out = gpubake(&[
        "build",
        "--without-python",
        &recipe,
        "--from",
        &common::from_base(),
        "--to",
        &format!("oci:{}:v1", dir.path().join("o").display()),
    ]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("has no /var/lib/dpkg/status"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("o").exists(), "nothing written");
}

#[test]
fn a_name_that_is_no_package_name_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path(), "[numactl, Bad_Name]");
    let out = gpubake(&["resolve", &recipe]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("r.yaml:6") && err.contains("Bad_Name"),
        "{err}"
    );
}

#[test]
fn an_unknown_package_is_refused_with_the_nearest_names() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path(), "[numactll]");
    let out = gpubake(&[
        "build",
        "--without-python",
        &recipe,
        "--from",
        &format!("oci:{}:bookworm", base.display()),
        "--to",
        &format!("oci:{}:v1", dir.path().join("o").display()),
    ]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("r.yaml:6") && err.contains("nearest names: numactl"),
        "{err}"
    );
}

#[test]
fn a_deb_changed_in_the_cache_is_found_and_fetched_again() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let recipe = recipe(dir.path(), "[numactl]");
    let run = |to: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(["build", "--without-python", &recipe, "--no-cache", "--from"])
            .arg(format!("oci:{}:bookworm", base.display()))
            .args(["--to", to])
            .env("GPUBAKE_CACHE_DIR", &cache)
            .output()
            .unwrap()
    };
    let first = run(&format!("oci:{}:v1", dir.path().join("a").display()));
    assert_exit(&first, 0);
    // The .debs the build fetched are in the cache by their SHA256: one byte of each flips.
    let mut flipped = 0;
    for entry in walkdir::WalkDir::new(&cache) {
        let entry = entry.unwrap();
        let path = entry.path();
        // The cache's layout holds the layers a layout build left there; the .debs are apart.
        let layers = path.starts_with(cache.join("layout"));
        if entry.file_type().is_file() && path.extension().is_none() && !layers {
            common::flip_byte(path, 1000);
            flipped += 1;
        }
    }
    assert!(flipped >= 2, "numactl and libnuma1 are cached: {flipped}");
    // Each corrupt copy is found when it is used, removed and fetched again, checked
    // against the lock: the image is the one the good copies made.
    let out = run(&format!("oci:{}:v1", dir.path().join("c").display()));
    assert_exit(&out, 0);
    let err = stderr(&out);
    assert_eq!(
        err.matches("the cached copy is corrupt").count(),
        flipped,
        "{err}"
    );
    let manifest = |o: &std::process::Output| {
        stdout(o)
            .lines()
            .find(|l| l.trim_start().starts_with("manifest"))
            .map(str::to_string)
    };
    assert_eq!(manifest(&first), manifest(&out));
}

/// The packages of the oracle: those a multi-node image takes whose maintainer scripts do
/// something (alternatives, groups, a setgid file, runlevel links, the loader cache).
const ORACLE: &str = "[openssh-client, rdma-core, ibverbs-providers, libfabric1, libopenmpi3, \
                      openmpi-bin, libucx0, libblas3, numactl]";

/// What apt leaves in an image, as the image's own tools tell it, section by section.
const FACTS: &str = r#"
echo "== packages"; dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\n' | sort
echo "== audit"; dpkg --audit; echo "rc $?"
echo "== groups"; cut -d: -f1,4 /etc/group | sort
echo "== gids"; cat /etc/group
echo "== users"; cut -d: -f1,6,7 /etc/passwd | sort
echo "== alternatives"; ls /var/lib/dpkg/alternatives | while read a; do echo "-- $a"; cat "/var/lib/dpkg/alternatives/$a"; update-alternatives --display "$a"; done
echo "== /etc/alternatives"; for f in /etc/alternatives/*; do echo "$f -> $(readlink "$f")"; done
echo "== statoverride"; cat /var/lib/dpkg/statoverride 2>/dev/null
echo "== runlevels"; for f in /etc/rc?.d/*; do echo "$f -> $(readlink "$f")"; done
echo "== ldconfig"; ldconfig -p | grep -v "^Cache generated by"
echo "== find_library"; python3 -c "import ctypes.util as u; print(*[u.find_library(n) for n in ('ibverbs', 'fabric', 'psm_infinipath', 'mpi', 'ucp')])"
echo "== files"; dpkg-query -W -f '${Package}\n' | while read p; do dpkg -L "$p"; done | sort -u | while read f; do if [ -e "$f" ] || [ -L "$f" ]; then stat -c '%n %F %a %U %G' "$f"; else echo "$f missing"; fi; done
echo "== library links"; find / -xdev -name 'lib*.so*' -type l 2>/dev/null | sort | while read f; do echo "$f -> $(readlink "$f")"; done
echo "== libfabric"; ldd /usr/lib/x86_64-linux-gnu/libfabric.so.1 | grep -c "not found" || true
"#;

/// The sections of [`FACTS`] run in `tag`, by heading.
fn facts(tag: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let (ok, text) = docker_run(tag, FACTS);
    assert!(ok, "{text}");
    let mut out = std::collections::BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("== ") {
            section = h.to_string();
        } else {
            out.entry(section.clone())
                .or_insert_with(Vec::new)
                .push(line.to_string());
        }
    }
    out
}

/// The oracle of the OS layer: the same pins installed by `apt-get` in the engine (the
/// `--engine-build` path, which runs every maintainer script and trigger) and unpacked without
/// it, on Debian bookworm and on Ubuntu 24.04. The images agree on every package file with its
/// mode and owner, the groups and users, the alternatives (their links and
/// update-alternatives' own account), the runlevel links, the loader cache and the soname
/// links, and dpkg's audit. What still differs is listed with why: apt's own directories on
/// both (its download cache, made by running apt, and its lists, which the rendered
/// Dockerfile empties after installing); on bookworm the gids of adduser's system groups
/// (numbered in the order packages are configured, which apt picks by its own ordering and
/// gpubake takes as the unpacking order); on noble the modes systemd-tmpfiles gives
/// /etc/credstore (the recipe's `systemd` skip passes over systemd-tmpfiles).
#[test]
fn the_daemonless_layer_is_what_apt_leaves_on_debian() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let scripts = "system_scripts:\n  udev: {skip: \"the hardware database is the host's\"}\n";
    let ours = oracle(&base, "bookworm", ORACLE, scripts, &["gids"]);
    assert!(
        ours["runlevels"]
            .iter()
            .any(|l| l == "/etc/rc2.d/S01iwpmd -> ../init.d/iwpmd")
    );
}

#[test]
fn the_daemonless_layer_is_what_apt_leaves_on_ubuntu() {
    let Some(base) = common::ubuntu_base() else {
        return;
    };
    // Ubuntu's udev needs systemd, whose scripts start services and make tmpfiles.
    let scripts = "system_scripts:\n  udev: {skip: \"the hardware database is the host's\"}\n  \
                   systemd: {skip: \"no init system runs in a container\"}\n";
    let packages = ORACLE.replace("libopenmpi3", "libopenmpi3t64");
    let ours = oracle(&base, "noble", &packages, scripts, &["/etc/credstore"]);
    // systemd-sysusers' users and groups, numbered down from 999 as it numbers them.
    assert!(
        ours["users"]
            .iter()
            .any(|l| l == "systemd-network:/:/usr/sbin/nologin")
    );
    assert!(ours["gids"].iter().any(|l| l == "systemd-journal:x:999:"));
}

/// Builds `packages` on the base at `layout:tag` both ways and compares them (see above);
/// `differ` names the sections, or the path prefixes of files, whose difference is known.
/// Returns the daemonless image's facts.
fn oracle(
    layout: &Path,
    tag: &str,
    packages: &str,
    scripts: &str,
    differ: &[&str],
) -> std::collections::BTreeMap<String, Vec<String>> {
    if !common::have("docker", "version") {
        assert!(std::env::var_os("CI").is_none(), "CI has a Docker Engine");
        eprintln!("skipped: no Docker Engine");
        return Default::default();
    }
    let dir = tempfile::tempdir().unwrap();
    let base_tag = format!("gpubake-system-base:{tag}");
    let out = gpubake(&[
        "copy",
        &format!("oci:{}:{tag}", layout.display()),
        &format!("docker-daemon:{base_tag}"),
    ]);
    assert_exit(&out, 0);
    let from = format!("docker-daemon:{base_tag}");
    let (base_ref, python) = match tag {
        "noble" => ("ubuntu:24.04", "3.12"),
        _ => ("debian:bookworm", "3.11"),
    };
    let recipe_of = |name: &str, scripts: &str| {
        write(
            dir.path(),
            name,
            &format!(
                "name: sys-test\nbase: {base_ref}\npython: \"{python}\"\npytorch: \"2.9\"\n\
                 presets: [base]\nsystem: {packages}\n{scripts}"
            ),
        )
    };

    // udev (rdma-core needs it) builds its hardware database in its postinst: without a word
    // from the recipe the build refuses, at the recipe's `system:` line.
    let refused = recipe_of("refused.yaml", "");
    let out = gpubake(&[
        "build",
        "--without-python",
        &refused,
        "--from",
        &from,
        "--to",
        &format!("oci:{}:v1", dir.path().join("refused").display()),
    ]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("refused.yaml:6:9")
            && err.contains("'s p")
            && err.contains("system_scripts: {"),
        "{err}"
    );
    assert!(!dir.path().join("refused").join("index.json").exists());

    let recipe = recipe_of("r.yaml", scripts);
    let daemonless = format!("gpubake-system-daemonless:{tag}");
    let engine = format!("gpubake-system-engine:{tag}");
    let lock = dir.path().join("lock.yaml");
    let out = gpubake(&[
        "build",
        "--without-python",
        &recipe,
        "--from",
        &from,
        "--to",
        &format!("docker-daemon:{daemonless}"),
        "--lock-out",
        &lock.display().to_string(),
    ]);
    assert_exit(&out, 0);
    // What is passed over is said, with the recipe's reason (command by command when the
    // layer is made rather than reused).
    assert!(
        stderr(&out).contains(
            "note: udev's maintainer scripts are settled without what gpubake cannot make \
             (the hardware database is the host's)"
        ),
        "{}",
        stderr(&out)
    );
    let out = gpubake(&[
        "build",
        "--without-python",
        "--engine-build",
        &recipe,
        "--from",
        &from,
        "--to",
        &format!("docker-daemon:{engine}"),
    ]);
    assert_exit(&out, 0);
    let (mut ours, mut apts) = (facts(&daemonless), facts(&engine));
    let facts_ours = ours.clone();
    for facts in [&mut ours, &mut apts] {
        for known in differ {
            facts.remove(*known);
        }
        facts.get_mut("files").unwrap().retain(|l| {
            !l.starts_with("/var/cache/apt/")
                && !l.starts_with("/var/lib/apt/lists/")
                && !differ
                    .iter()
                    .any(|d| d.starts_with('/') && l.starts_with(d))
        });
    }
    for (section, apt) in &apts {
        let mine = ours.get(section).cloned().unwrap_or_default();
        let only_ours: Vec<&String> = mine.iter().filter(|l| !apt.contains(l)).collect();
        let only_apts: Vec<&String> = apt.iter().filter(|l| !mine.contains(l)).collect();
        assert_eq!(
            &mine, apt,
            "{tag} == {section}: only daemonless {only_ours:#?}, only apt's {only_apts:#?}"
        );
    }
    assert_eq!(ours.len(), apts.len());
    // And what each of those says is what a multi-node job needs.
    let lock: serde_yaml::Value = serde_yaml::from_slice(&std::fs::read(&lock).unwrap()).unwrap();
    assert!(lock["system"].as_sequence().unwrap().len() > 30);
    assert_eq!(ours["audit"], ["rc 0"]);
    let found = &ours["find_library"][0];
    for lib in [
        "libibverbs.so.1",
        "libfabric.so.1",
        "libpsm_infinipath.so.1",
        "libmpi.so.40",
        "libucp.so.0",
    ] {
        assert!(found.split(' ').any(|f| f == lib), "{lib} in {found}");
    }
    assert_eq!(ours["libfabric"], ["0"], "libfabric's libraries all load");
    for wanted in [
        "/etc/alternatives/libpsm_infinipath.so.1 -> /usr/lib/libpsm1/libpsm_infinipath.so.1.16",
        "/etc/alternatives/mpirun -> /usr/bin/mpirun.openmpi",
    ] {
        assert!(
            ours["/etc/alternatives"].iter().any(|l| l == wanted),
            "{wanted}"
        );
    }
    assert!(ours["groups"].iter().any(|l| l == "rdma:"));
    assert!(ours["groups"].iter().any(|l| l == "_ssh:"));
    assert!(
        ours["files"]
            .iter()
            .any(|l| l == "/usr/bin/ssh-agent regular file 2755 root _ssh"),
        "ssh-agent is setgid _ssh"
    );
    for t in [&daemonless, &engine, &base_tag] {
        let _ = Command::new("docker").args(["rmi", "-f", t]).output();
    }
    facts_ours
}

#[test]
fn render_pins_the_system_packages_or_says_why_it_cannot() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path(), "[numactl]");
    let from = format!("oci:{}:bookworm", base.display());
    let out = gpubake(&["render", &recipe, "--from", &from]);
    assert_exit(&out, 0);
    let dockerfile = stdout(&out);
    let out = gpubake(&["resolve", &recipe, "--no-closure", "--from", &from]);
    assert_exit(&out, 0);
    let lock: serde_yaml::Value = serde_yaml::from_str(&stdout(&out)).unwrap();
    for p in lock["system"].as_sequence().unwrap() {
        let pin = format!(
            "{}={} \\",
            p["name"].as_str().unwrap(),
            p["version"].as_str().unwrap()
        );
        assert!(
            dockerfile.lines().any(|l| l.trim() == pin),
            "{pin}: {dockerfile}"
        );
    }
    // Without --from the recipe's base is read from its registry; where that cannot be
    // reached (nothing listens on port 1) no Dockerfile is written without its packages.
    let unreachable = write(
        dir.path(),
        "u.yaml",
        "name: u\nbase: 127.0.0.1:1/library/debian:bookworm\npython: \"3.11\"\n\
         pytorch: \"2.9\"\nsystem: [numactl]\n",
    );
    let d = dir.path().join("D").display().to_string();
    let out = gpubake(&["render", &unreachable, "-o", &d]);
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("pass --from"), "{}", stderr(&out));
    assert!(!dir.path().join("D").exists());
}

/// The roce preset's settings need libibverbs and a provider. Without them in `system:`,
/// lint (which reads no base), `resolve --from` and build warn, and the probe in the image,
/// opening the libraries as NCCL does, fails naming the loader's words; with ibverbs-providers
/// (which brings libibverbs1) nothing warns and both libraries load in the container.
#[test]
fn a_roce_preset_without_libibverbs_is_warned_of_and_the_probe_in_the_image_fails() {
    let Some(base) = common::debian_base() else {
        return;
    };
    if !common::have("docker", "version") {
        assert!(std::env::var_os("CI").is_none(), "CI has a Docker Engine");
        eprintln!("skipped: no Docker Engine");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let from = format!("oci:{}:bookworm", base.display());
    for (system, warned) in [("", true), ("system: [ibverbs-providers]\n", false)] {
        let recipe = write(
            dir.path(),
            "roce.yaml",
            &format!(
                "name: roce\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
                 presets: [base, roce]\n{system}"
            ),
        );
        let sockets = "NCCL would run across nodes over TCP sockets";
        let out = gpubake(&["lint", "--json", &recipe]);
        let lint = stdout(&out);
        assert_eq!(lint.contains("\"os-need\""), warned, "{system}: {lint}");
        let out = gpubake(&["resolve", &recipe, "--no-closure", "--from", &from]);
        assert_exit(&out, 0);
        assert_eq!(stderr(&out).contains(sockets), warned, "{}", stderr(&out));

        let tag = format!("gpubake-roce-test:{}-{warned}", std::process::id());
        let to = format!("docker-daemon:{tag}");
        let out = gpubake(&[
            "build",
            "--without-python",
            &recipe,
            "--from",
            &from,
            "--to",
            &to,
        ]);
        assert_exit(&out, 0);
        let err = stderr(&out);
        assert_eq!(err.contains(sockets), warned, "{system}: {err}");
        if warned {
            assert!(
                err.contains("add `system: [libibverbs1, ibverbs-providers]`"),
                "{err}"
            );
        }
        // certify's static checks ask the image's loader for the same names.
        let out = gpubake(&["certify", &to, "--gpus", "none"]);
        let text = stdout(&out);
        let line = text
            .lines()
            .find(|l| l.contains("IB transport libraries"))
            .unwrap_or_else(|| panic!("{text}"));
        if warned {
            assert_exit(&out, 1);
            assert!(
                line.starts_with("  FAIL") && line.contains("libibverbs.so.1 not found"),
                "{line}"
            );
        } else {
            assert_exit(&out, 0);
            assert!(
                line.starts_with("  PASS")
                    && line.contains("x86_64-linux-gnu/libibverbs.so.1,")
                    && line.contains("x86_64-linux-gnu/libmlx5.so.1 (for NCCL_NET=IB"),
                "{line}"
            );
        }
        let run = Command::new("docker")
            .args(["run", "--rm", &tag, "gpubake", "probe", "--json"])
            .output()
            .unwrap();
        let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
        let report: serde_json::Value = serde_json::from_slice(&run.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&run.stderr)));
        let check = |name: &str| {
            report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .unwrap_or_else(|| panic!("no {name} check: {report}"))
                .clone()
        };
        for lib in ["libibverbs.so.1", "libmlx5.so.1"] {
            let c = check(lib);
            let detail = c["detail"].as_str().unwrap();
            assert!(
                detail.contains("(the image sets NCCL_NET=IB, NCCL_IB_"),
                "{detail}"
            );
            if warned {
                assert_eq!(c["status"], "FAIL", "{c}");
                assert!(
                    detail.contains(&format!("{lib}: cannot open shared object file")),
                    "{detail}"
                );
            } else {
                assert_eq!(c["status"], "PASS", "{c}");
                // The file ld.so mapped, as the kernel names it (links resolved).
                assert!(
                    detail.contains("loads /usr/lib/x86_64-linux-gnu/lib"),
                    "{detail}"
                );
            }
        }
        // Without a GPU the probe's verdict is the environment's either way (exit 3); its
        // check of the libraries is what differs.
        assert_eq!(run.status.code(), Some(3), "{report}");
    }
}

/// `--offline` takes the OS packages' pins from a lock (`--lock`) and their .debs from the
/// cache: the image is the online build's, an empty cache fails naming the .deb, and a lock
/// resolved for other asks, or none at all, is refused at its field before any network.
#[test]
fn an_offline_build_installs_the_locks_pins_from_the_cache_and_refuses_without_them() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let from = format!("oci:{}:bookworm", base.display());
    let recipe = recipe(dir.path(), "[numactl]");
    let lock = dir.path().join("gpubake.lock").display().to_string();
    let out = gpubake(&[
        "resolve",
        &recipe,
        "--no-closure",
        "--from",
        &from,
        "-o",
        &lock,
    ]);
    assert_exit(&out, 0);
    let build = |cache: &str, extra: &[&str], to: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args([
                "build",
                "--without-python",
                &recipe,
                "--from",
                &from,
                "--lock",
                &lock,
            ])
            .args(extra)
            .args(["--to", &format!("oci:{}:v1", dir.path().join(to).display())])
            .env("GPUBAKE_CACHE_DIR", dir.path().join(cache))
            .output()
            .unwrap()
    };
    let manifest = |o: &std::process::Output| {
        stdout(o)
            .lines()
            .find(|l| l.trim_start().starts_with("manifest"))
            .map(str::to_string)
    };
    let online = build("cache", &[], "online");
    assert_exit(&online, 0);
    let offline = build("cache", &["--offline", "--no-cache"], "offline");
    assert_exit(&offline, 0);
    assert_eq!(
        manifest(&online),
        manifest(&offline),
        "{}",
        stderr(&offline)
    );
    // An empty cache: the first .deb is missing, and nothing was fetched.
    let empty = build("empty", &["--offline"], "empty");
    assert_exit(&empty, 3);
    let err = stderr(&empty);
    assert!(
        err.contains(".debs are not in the cache") && err.contains("numactl_"),
        "{err}"
    );
    assert!(!dir.path().join("empty").exists());

    // The recipe now asks for more than the lock pins.
    let recipe = super_recipe(dir.path());
    let out = gpubake(&[
        "build",
        "--without-python",
        &recipe,
        "--offline",
        "--lock",
        &lock,
        "--from",
        &from,
        "--to",
        &format!("oci:{}:v1", dir.path().join("stale").display()),
    ]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("gpubake.lock")
            && err.contains("system_asked")
            && err.contains(
                "`system: [numactl]`, and the recipe asks for `system: [numactl, openssh-client]`"
            ),
        "{err}"
    );
    // No lock at all: refused at the recipe's field, saying what to pass.
    let out = gpubake(&[
        "build",
        "--without-python",
        &recipe,
        "--offline",
        "--from",
        &from,
        "--to",
        &format!("oci:{}:v1", dir.path().join("o").display()),
    ]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("r.yaml:6") && err.contains("pass --lock"),
        "{err}"
    );
    assert!(!dir.path().join("o").exists() && !dir.path().join("stale").exists());
}

/// The test recipe asking for one more package than [numactl].
fn super_recipe(dir: &Path) -> String {
    recipe(dir, "[numactl, openssh-client]")
}
