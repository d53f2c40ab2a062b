//! `docker://` against a real registry: Debian's docker-registry (distribution 2.8) on a free
//! 127.0.0.1 port, with htpasswd (bcrypt) logins and a self-signed TLS certificate, started by
//! each test and killed at its end; or without TLS, on loopback or on an address of a network
//! namespace of the test's own (which needs root). skopeo reads what gpubake pushes.

mod common;
#[path = "common/local_registry.rs"]
#[allow(dead_code)]
mod local_registry;

use common::{assert_exit, build_args, from_base, run, stderr, stdout, write};
use gpubake::image::digest::Digest;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const USER: &str = "baker";
const PASSWORD: &str = "s3cret-pass";

/// How a test registry checks its clients.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Auth {
    /// Basic credentials against an htpasswd file.
    Htpasswd,
    /// Bearer tokens from `tests/fixtures/token-server.py`, which takes the same login and
    /// refuses the user `outsider` whatever it asks.
    Token,
}

/// A user the token server knows and refuses (403) everything.
const OUTSIDER: &str = "outsider";

/// What a test registry speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// HTTPS with the self-signed certificate of [`make_certificate`].
    Tls,
    /// Plain HTTP, as most CI jobs run a throwaway registry.
    Plain,
}

/// A network namespace joined to this one by a veth pair, 10.234.N.1 on this side and
/// 10.234.N.2 on its side: an address that is not loopback for a registry to listen on. No
/// bridge, so the host's firewall (Docker's FORWARD policy) never sees its packets. Deleted,
/// with its veth pair, when dropped.
struct Namespace {
    name: String,
    subnet: u8,
}

impl Namespace {
    /// Makes one on 10.234.`subnet`.0/24; None (with the reason printed) where the test is
    /// not root or `ip` is missing, outside CI.
    fn make(subnet: u8) -> Option<Namespace> {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs the tests as root; a network namespace needs it"
            );
            eprintln!("skipped: a network namespace needs root");
            return None;
        }
        if !common::have("ip", "-V") {
            return None;
        }
        let name = format!("gbr{}-{subnet}", std::process::id() % 100_000);
        let ns = Namespace { name, subnet };
        let near = format!("v{}", ns.name);
        let ip = |args: &[&str]| run(Command::new("ip").args(args));
        ip(&["netns", "add", &ns.name]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ip(&[
            "link", "add", &near, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ]);
        ip(&[
            "addr",
            "add",
            &format!("10.234.{subnet}.1/24"),
            "dev",
            &near,
        ]);
        ip(&["link", "set", &near, "up"]);
        let far = format!("{}/24", ns.address());
        ip(&["-n", &ns.name, "addr", "add", &far, "dev", "eth0"]);
        ip(&["-n", &ns.name, "link", "set", "eth0", "up"]);
        Some(ns)
    }

    /// The namespace's address.
    fn address(&self) -> String {
        format!("10.234.{}.2", self.subnet)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
    }
}

/// A registry of this test's own: its directory holds the config, the certificate, the
/// htpasswd file, the stored images, a docker `config.json` with the right login (`auth/`),
/// one with a wrong password (`wrong/`), one for the token server's refused user
/// (`outsider/`) and one with none (`none/`). With [`Auth::Token`], `scopes.log` lists the
/// scopes of each token request, one request a line.
struct Registry {
    dir: tempfile::TempDir,
    addr: String,
    wire: Wire,
    child: Option<Child>,
    token_server: Option<Child>,
    /// The namespace the registry listens in; None for 127.0.0.1. Dropped after the registry
    /// is killed.
    netns: Option<Namespace>,
}

/// A self-signed certificate for 127.0.0.1 in `d`: `cert.pem`, `key.pem`, and `certs/ca.crt`
/// (the directory `--cert-dir` takes).
fn make_certificate(d: &Path) {
    run(Command::new("openssl").args([
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=IP:127.0.0.1,DNS:localhost",
        "-addext",
        // rustls (webpki) refuses a CA certificate as the server's own.
        "basicConstraints=critical,CA:FALSE",
        "-keyout",
        &d.join("key.pem").display().to_string(),
        "-out",
        &d.join("cert.pem").display().to_string(),
    ]));
    std::fs::create_dir(d.join("certs")).unwrap();
    std::fs::copy(d.join("cert.pem"), d.join("certs/ca.crt")).unwrap();
}

impl Registry {
    /// Starts one checking basic credentials; None (with the reason printed) where a tool is
    /// missing outside CI.
    fn start() -> Option<Registry> {
        Registry::start_with(Auth::Htpasswd)
    }

    /// Starts one checking its clients as `auth` says.
    fn start_with(auth: Auth) -> Option<Registry> {
        Registry::start_as(auth, Wire::Tls, None)
    }

    /// Starts one checking basic credentials over plain HTTP, in `netns` when given (else on
    /// 127.0.0.1).
    fn plain(netns: Option<Namespace>) -> Option<Registry> {
        Registry::start_as(Auth::Htpasswd, Wire::Plain, netns)
    }

    /// Starts one checking its clients as `auth` says, speaking `wire`, in `netns` when given.
    fn start_as(auth: Auth, wire: Wire, netns: Option<Namespace>) -> Option<Registry> {
        if !common::tools()
            || !common::have("docker-registry", "--version")
            || !common::have("openssl", "version")
            || !makes_htpasswd()
            || (auth == Auth::Token && !common::have("python3", "--version"))
        {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        make_certificate(d);
        let tls = match wire {
            Wire::Tls => format!(
                "  tls: {{certificate: {dir}/cert.pem, key: {dir}/key.pem}}\n",
                dir = d.display()
            ),
            Wire::Plain => String::new(),
        };
        let (auth_config, token_server) = match auth {
            Auth::Htpasswd => {
                let htpasswd = run(Command::new("htpasswd").args(["-nbB", USER, PASSWORD]));
                std::fs::write(d.join("htpasswd"), htpasswd).unwrap();
                (
                    format!(
                        "htpasswd: {{realm: gpubake-test, path: {}/htpasswd}}",
                        d.display()
                    ),
                    None,
                )
            }
            Auth::Token => {
                let (realm, child) = start_token_server(d, netns.as_ref());
                (
                    format!(
                        "token: {{realm: \"{realm}\", service: gpubake-test-registry, \
                         issuer: gpubake-test-issuer, rootcertbundle: {}/token-cert.pem}}",
                        d.display()
                    ),
                    Some(child),
                )
            }
        };
        // The port is picked after the token server has bound its own: picked before, the
        // port freed for the registry could be the one the token server is then given.
        let addr = match &netns {
            // A namespace of the test's own has every port free.
            Some(ns) => format!("{}:5000", ns.address()),
            None => {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port();
                format!("127.0.0.1:{port}")
            }
        };
        std::fs::write(
            d.join("config.yml"),
            format!(
                "version: 0.1\n\
                 log: {{level: warn}}\n\
                 storage:\n  filesystem: {{rootdirectory: {data}}}\n  delete: {{enabled: true}}\n\
                 http:\n  addr: {addr}\n  secret: gpubake-test\n{tls}\
                 auth:\n  {auth_config}\n",
                data = d.join("data").display(),
            ),
        )
        .unwrap();
        for (name, user, password) in [
            ("auth", USER, PASSWORD),
            ("wrong", USER, "not-the-password"),
            (OUTSIDER, OUTSIDER, PASSWORD),
        ] {
            let login = base64_encode(format!("{user}:{password}").as_bytes());
            write(
                d,
                &format!("{name}/config.json"),
                &format!(r#"{{"auths": {{"{addr}": {{"auth": "{login}"}}}}}}"#),
            );
        }
        std::fs::create_dir(d.join("none")).unwrap();
        let mut registry = Registry {
            dir,
            addr,
            wire,
            child: None,
            token_server,
            netns,
        };
        registry.serve();
        Some(registry)
    }

    /// The scopes each token request asked for since the last call, one request a line
    /// (sorted within the line), and the log emptied.
    fn token_requests(&self) -> Vec<String> {
        let log = self.dir.path().join("scopes.log");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        std::fs::write(&log, "").unwrap();
        text.lines().map(str::to_string).collect()
    }

    /// Starts (or restarts) the registry process and waits until it answers.
    fn serve(&mut self) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("registry.log"))
            .unwrap();
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.name, "docker-registry"]);
                c
            }
            None => Command::new("docker-registry"),
        };
        let child = command
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry starts");
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(&self.addr).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the registry did not listen on {}: {}",
                self.addr,
                std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the registry process (SIGKILL), as a crash would.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `docker://ADDR/NAME`.
    fn image(&self, name: &str) -> String {
        format!("docker://{}/{name}", self.addr)
    }

    fn certs(&self) -> String {
        self.dir.path().join("certs").display().to_string()
    }

    /// gpubake with the docker config `which` (`auth`, `wrong` or `none`) and no other
    /// credentials in reach.
    fn command(&self, which: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpubake"));
        cmd.args(args)
            .current_dir(common::root())
            .env("DOCKER_CONFIG", self.dir.path().join(which))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("none"))
            // Which registries are insecure is the test's to say, not this machine's.
            .env(
                "CONTAINERS_REGISTRIES_CONF",
                self.dir.path().join("none/registries.conf"),
            )
            .env(
                "GPUBAKE_DOCKER_DAEMON_JSON",
                self.dir.path().join("none/daemon.json"),
            )
            .env_remove("REGISTRY_AUTH_FILE")
            .env_remove("GPUBAKE_PRESET_PATH");
        cmd
    }

    /// Runs [`Self::command`] to its end.
    fn gpubake(&self, which: &str, args: &[&str]) -> Output {
        self.command(which, args)
            .output()
            .expect("the gpubake binary runs")
    }

    /// Starts `gpubake copy SRC DEST` with the `auth` login, trusting the registry's
    /// certificate, for a test to cut short; its output is kept.
    fn spawn_copy(&self, src: &str, dest: &str) -> Child {
        self.command("auth", &["copy", src, dest, "--cert-dir", &self.certs()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// [`Self::gpubake`] with `--cert-dir` trusting the registry's certificate.
    fn trusted(&self, which: &str, args: &[&str]) -> Output {
        let certs = self.certs();
        let mut args = args.to_vec();
        args.extend(["--cert-dir", &certs]);
        self.gpubake(which, &args)
    }

    /// `gpubake copy SRC DEST`, trusting the registry's certificate.
    fn copy(&self, which: &str, src: &str, dest: &str) -> Output {
        self.trusted(which, &["copy", src, dest])
    }

    /// `skopeo inspect ARGS… docker://ADDR/NAME` with the right login, trusting the
    /// registry's certificate (or, without TLS, with `--tls-verify=false`).
    fn skopeo_inspect(&self, args: &[&str], name: &str) -> Output {
        let certs = self.certs();
        let reach = match self.wire {
            Wire::Tls => vec!["--cert-dir", &certs],
            Wire::Plain => vec!["--tls-verify=false"],
        };
        Command::new("skopeo")
            .arg("inspect")
            .args(args)
            .args(reach)
            .args(["--creds", &format!("{USER}:{PASSWORD}")])
            .arg(self.image(name))
            .output()
            .expect("skopeo runs")
    }

    /// What skopeo prints for `name` (`--raw`: the manifest as stored), as JSON.
    fn skopeo_json(&self, args: &[&str], name: &str) -> Value {
        let out = self.skopeo_inspect(args, name);
        assert!(out.status.success(), "skopeo: {}", stderr(&out));
        serde_json::from_str(&stdout(&out)).unwrap()
    }

    /// The manifest digest skopeo reads for `name`.
    fn skopeo_digest(&self, name: &str) -> String {
        self.skopeo_json(&[], name)["Digest"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Bytes of blob uploads the registry has received and not finished.
    fn uploading(&self) -> u64 {
        walkdir::WalkDir::new(self.dir.path().join("data"))
            .into_iter()
            .flatten()
            .filter(|e| {
                e.file_name() == "data"
                    && e.path().components().any(|c| c.as_os_str() == "_uploads")
            })
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut child) = self.token_server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `tests/fixtures/token-server.py` for a registry in `d`, with a signing key and
/// certificate of its own (`token-key.pem`, `token-cert.pem`: the registry's rootcertbundle),
/// on 127.0.0.1 or in `netns`; returns its realm and its process.
fn start_token_server(d: &Path, netns: Option<&Namespace>) -> (String, Child) {
    run(Command::new("openssl").args([
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=gpubake-test-token-signer",
        "-keyout",
        &d.join("token-key.pem").display().to_string(),
        "-out",
        &d.join("token-cert.pem").display().to_string(),
    ]));
    let port_file = d.join("token-port");
    let (mut command, host) = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns.name, "python3"]);
            (c, ns.address())
        }
        None => (Command::new("python3"), "127.0.0.1".to_string()),
    };
    let child = command
        .arg(common::root().join("tests/fixtures/token-server.py"))
        .args(["--host", &host])
        .arg("--port-file")
        .arg(&port_file)
        .arg("--key")
        .arg(d.join("token-key.pem"))
        .arg("--cert")
        .arg(d.join("token-cert.pem"))
        .args(["--issuer", "gpubake-test-issuer"])
        .args(["--service", "gpubake-test-registry"])
        .args(["--user", USER, "--password", PASSWORD, "--refuse", OUTSIDER])
        .arg("--log")
        .arg(d.join("scopes.log"))
        .stderr(std::fs::File::create(d.join("token-server.log")).unwrap())
        .spawn()
        .expect("python3 runs the token server");
    let start = Instant::now();
    let port = loop {
        if let Ok(port) = std::fs::read_to_string(&port_file) {
            break port;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the token server did not start: {}",
            std::fs::read_to_string(d.join("token-server.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    (format!("http://{host}:{port}/token"), child)
}

/// True when apache2-utils' htpasswd makes bcrypt lines; in CI its absence fails the test.
fn makes_htpasswd() -> bool {
    let ok = Command::new("htpasswd")
        .args(["-nbB", "a", "b"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs htpasswd; it must run"
        );
        eprintln!("skipped: htpasswd is not available");
    }
    ok
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn recipe_in(dir: &Path, extra: &str) -> String {
    write(
        dir,
        "recipe.yaml",
        &format!("name: regtest\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\n{extra}"),
    )
}

/// The digest the image tagged `tag` has in the OCI layout `dir`.
fn layout_digest(dir: &Path, tag: &str) -> String {
    let out = run(Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci:{}:{tag}", dir.display())));
    let v: Value = serde_json::from_str(&out).unwrap();
    v["Digest"].as_str().unwrap().to_string()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_str(&stdout(out))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(out), stderr(out)))
}

#[test]
fn a_build_pushed_to_a_registry_has_the_digest_of_the_same_build_in_a_layout() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    let base = from_base();
    let out = reg.gpubake(
        "auth",
        &build_args(&recipe, &base, &format!("oci:{}:v1", layout.display()), &[]),
    );
    assert_exit(&out, 0);
    let target = reg.image("gpubake/app:v1");
    let out = reg.trusted("auth", &build_args(&recipe, &base, &target, &["--json"]));
    assert_exit(&out, 0);
    let report = json_of(&out);
    let want = layout_digest(&layout, "v1");
    assert_eq!(report["manifest"].as_str(), Some(want.as_str()), "{report}");
    assert_eq!(reg.skopeo_digest("gpubake/app:v1"), want);

    // Read back: inspect shows the same digest, and verify re-hashes every blob.
    let out = reg.trusted("auth", &["inspect", &target, "--json"]);
    assert_exit(&out, 0);
    assert_eq!(json_of(&out)["manifest"].as_str(), Some(want.as_str()));
    let out = reg.gpubake("auth", &["verify", &target, "--tls-verify=false"]);
    assert_exit(&out, 0);
    let out = reg.trusted("auth", &["certify", &target, "--gpus", "none"]);
    assert_exit(&out, 0);
}

/// Pulled from the recipe's own `base:`, the image names it (org.opencontainers.image.base.name
/// beside its digest) and the build has no other base to tell of.
#[test]
fn the_recipes_own_base_is_named_and_no_other_base_is_announced() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let remote_base = reg.image("library/own-base:1");
    assert_exit(&reg.copy("auth", &from_base(), &remote_base), 0);
    let reference = remote_base.trim_start_matches("docker://").to_string();
    let recipe = write(
        dir.path(),
        "recipe.yaml",
        &format!("name: own\nbase: {reference}\npytorch: '2.9'\npresets: [base]\n"),
    );
    let layout = dir.path().join("out");
    let out = reg.trusted(
        "auth",
        &build_args(
            &recipe,
            &remote_base,
            &format!("oci:{}:v1", layout.display()),
            &[],
        ),
    );
    assert_exit(&out, 0);
    assert!(
        !stderr(&out).contains("not against the recipe's base"),
        "{}",
        stderr(&out)
    );
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let digest = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(
            layout
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:")),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.base.name"],
        reference.as_str(),
        "{manifest}"
    );
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.base.digest"],
        reg.skopeo_digest("library/own-base:1").as_str(),
        "{manifest}"
    );
}

#[test]
fn a_registry_image_serves_as_the_base() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = from_base();
    let remote_base = reg.image("library/busybox-base:1");
    assert_exit(&reg.copy("auth", &base, &remote_base), 0);
    let recipe = recipe_in(dir.path(), "");
    let mut digests = Vec::new();
    for (name, from) in [("local", base.as_str()), ("pulled", remote_base.as_str())] {
        let out = reg.trusted(
            "auth",
            &build_args(
                &recipe,
                from,
                &format!("oci:{}:v1", dir.path().join(name).display()),
                &["--json"],
            ),
        );
        assert_exit(&out, 0);
        digests.push(json_of(&out)["manifest"].as_str().unwrap().to_string());
    }
    // The same base, read from a layout or pulled, gives the same image.
    assert_eq!(digests[0], digests[1]);
    assert_exit(
        &reg.gpubake(
            "auth",
            &[
                "verify",
                &format!("oci:{}:v1", dir.path().join("pulled").display()),
            ],
        ),
        0,
    );
}

#[test]
fn copy_round_trips_through_a_registry() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = from_base();
    let remote = reg.image("copies/base:rt");
    let back = format!("oci:{}:rt", dir.path().join("back").display());
    let out = reg.copy("auth", &base, &remote);
    assert_exit(&out, 0);
    let out = reg.copy("auth", &remote, &back);
    assert_exit(&out, 0);
    let want = layout_digest(&common::base(), "latest");
    assert_eq!(reg.skopeo_digest("copies/base:rt"), want);
    assert_eq!(layout_digest(&dir.path().join("back"), "rt"), want);
    assert_exit(&reg.gpubake("auth", &["verify", &back]), 0);
    // Within one registry a copy mounts the blobs rather than uploading them again.
    let out = reg.copy("auth", &remote, &reg.image("copies/again:rt"));
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains("0 blobs uploaded")
            && stderr(&out).contains("mounted from copies/base"),
        "{}",
        stderr(&out)
    );
    assert_eq!(reg.skopeo_digest("copies/again:rt"), want);
    // And to a docker archive that skopeo reads.
    let archive = dir.path().join("rt.tar");
    let out = reg.trusted(
        "auth",
        &[
            "copy",
            &remote,
            &format!("docker-archive:{}", archive.display()),
        ],
    );
    assert_exit(&out, 0);
    run(Command::new("skopeo")
        .arg("inspect")
        .arg(format!("docker-archive:{}", archive.display())));
}

#[test]
fn wrong_or_missing_credentials_and_an_unknown_certificate_are_named() {
    let Some(reg) = Registry::start() else { return };
    let base = from_base();
    let target = reg.image("denied/base:1");

    let out = reg.trusted("wrong", &["copy", &base, &target]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("refused the credentials"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("config.json"), "{}", stderr(&out));

    let out = reg.trusted("none", &["copy", &base, &target]);
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains("asks for credentials"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("docker login"), "{}", stderr(&out));

    let out = reg.trusted("none", &["inspect", &target]);
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains("asks for credentials"),
        "{}",
        stderr(&out)
    );

    // The self-signed certificate without --cert-dir is refused, saying what to pass.
    let out = reg.gpubake("auth", &["copy", &base, &target]);
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("certificate"), "{}", stderr(&out));
    assert!(stderr(&out).contains("--cert-dir"), "{}", stderr(&out));

    // An --authfile replaces the usual places.
    let out = reg.trusted(
        "none",
        &[
            "copy",
            &base,
            &target,
            "--authfile",
            &reg.dir
                .path()
                .join("auth/config.json")
                .display()
                .to_string(),
        ],
    );
    assert_exit(&out, 0);
}

/// Waits until `seen` holds, failing the test when `child` (a `push` or `pull`) ends first
/// or two minutes pass.
fn wait_while_running(child: &mut Child, what: &str, seen: impl Fn() -> bool) {
    let start = Instant::now();
    while !seen() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the {what} was not seen moving data"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the {what} ended before the kill"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_registry_killed_mid_transfer_leaves_a_push_a_retry_completes_and_a_pull_that_resumes() {
    let Some(mut reg) = Registry::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A layer large enough to be caught mid-upload: 192 MiB that gzip cannot shrink.
    let data = dir.path().join("big");
    std::fs::create_dir(&data).unwrap();
    common::noise(&data.join("noise.bin"), 192, 0x2545f4914f6cdd1d);
    let recipe = recipe_in(dir.path(), "files:\n  - {src: big, dest: /data}\n");
    let layout = dir.path().join("out");
    let local = format!("oci:{}:v1", layout.display());
    assert_exit(
        &reg.gpubake("auth", &build_args(&recipe, &from_base(), &local, &[])),
        0,
    );
    let target = reg.image("big/app:v1");
    let mut push = reg.spawn_copy(&local, &target);
    wait_while_running(&mut push, "push", || reg.uploading() >= 16 << 20);
    reg.kill();
    let out = push.wait_with_output().unwrap();
    // Retries could not reach a dead registry: the push fails as the environment's fault,
    // and leaves no tag behind.
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("did not answer"), "{}", stderr(&out));
    reg.serve();
    let out = reg.skopeo_inspect(&[], "big/app:v1");
    assert!(!out.status.success(), "the tag exists after a failed push");
    // The same push again completes, and the registry holds the image gpubake built.
    let out = reg.copy("auth", &local, &target);
    assert_exit(&out, 0);
    assert_eq!(
        reg.skopeo_digest("big/app:v1"),
        layout_digest(&layout, "v1")
    );
    let back: PathBuf = dir.path().join("back");
    let out = reg.trusted(
        "auth",
        &["copy", &target, &format!("oci:{}:v1", back.display())],
    );
    assert_exit(&out, 0);
    assert_exit(
        &reg.gpubake("auth", &["verify", &format!("oci:{}:v1", back.display())]),
        0,
    );

    // A pull cut by a registry crash resumes with a Range request once the registry is back,
    // within the same run, and the blob is verified whole.
    let resumed = dir.path().join("resumed");
    let mut pull = reg.spawn_copy(&target, &format!("oci:{}:v1", resumed.display()));
    // Blobs are written beside index.json, then renamed among the blobs.
    let downloading = || {
        std::fs::read_dir(&resumed)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".gpubake-tmp-"))
            .filter_map(|e| e.metadata().ok())
            .any(|m| m.len() > 16 << 20)
    };
    wait_while_running(&mut pull, "pull", downloading);
    reg.kill();
    reg.serve();
    let out = pull.wait_with_output().unwrap();
    assert_exit(&out, 0);
    assert!(stderr(&out).contains("resuming blob"), "{}", stderr(&out));
    assert_eq!(layout_digest(&resumed, "v1"), layout_digest(&layout, "v1"));
    assert_exit(
        &reg.gpubake(
            "auth",
            &["verify", &format!("oci:{}:v1", resumed.display())],
        ),
        0,
    );
}

#[test]
fn an_index_is_read_for_the_platform_asked_for() {
    use gpubake::image::layout::{Layout, digest_of};
    use oci_spec::image::{ImageManifest, MediaType};
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    // The busybox base as linux/amd64, and the same layers under an arm64 config: two
    // manifests in one index, pushed with skopeo.
    let multi = dir.path().join("multi");
    run(Command::new("cp").arg("-r").arg(common::base()).arg(&multi));
    let layout = Layout::open(&multi).unwrap();
    let amd = layout.find(Some("latest")).unwrap();
    let manifest: ImageManifest =
        serde_json::from_slice(&layout.read_blob(&digest_of(&amd).unwrap(), None).unwrap())
            .unwrap();
    let mut config: Value = serde_json::from_slice(
        &layout
            .read_blob(&digest_of(manifest.config()).unwrap(), None)
            .unwrap(),
    )
    .unwrap();
    config["architecture"] = Value::from("arm64");
    let mut arm_manifest = manifest.clone();
    arm_manifest.set_config(layout.write_json(&config, MediaType::ImageConfig).unwrap());
    let arm = layout
        .write_json(&arm_manifest, MediaType::ImageManifest)
        .unwrap();
    let index_desc = common::tag_index(
        &layout,
        &[(&amd, "linux/amd64"), (&arm, "linux/arm64")],
        "multi",
    );
    let index_digest = index_desc.digest().to_string();
    let remote = reg.image("multi/base:1");
    run(Command::new("skopeo")
        .args(["copy", "--all", "--dest-cert-dir", &reg.certs()])
        .args(["--dest-creds", &format!("{USER}:{PASSWORD}")])
        .arg(format!("oci:{}:multi", multi.display()))
        .arg(&remote));

    // Without --platform the whole index is copied (every platform, the index's bytes);
    // with one, that platform's manifest alone.
    let arm_digest = arm.digest().to_string();
    for (platform, want) in [(None, &index_digest), (Some("linux/arm64"), &arm_digest)] {
        let to = dir
            .path()
            .join(platform.unwrap_or("host").replace('/', "-"));
        let mut args = vec![
            "copy".to_string(),
            remote.clone(),
            format!("oci:{}:v1", to.display()),
        ];
        if let Some(p) = platform {
            args.extend(["--platform".to_string(), p.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_exit(&reg.trusted("auth", &args), 0);
        assert_eq!(layout_digest(&to, "v1"), *want, "{platform:?}");
    }
    let out = reg.trusted("auth", &["inspect", &remote, "--platform", "linux/s390x"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("has no linux/s390x image; it has linux/amd64, linux/arm64"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_certificate_attached_as_a_referrer_is_found_by_the_tag_schema() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let target = reg.image("certified/app:v1");
    let out = reg.trusted(
        "auth",
        &build_args(&recipe, &from_base(), &target, &["--json"]),
    );
    assert_exit(&out, 0);
    let digest = json_of(&out)["manifest"].as_str().unwrap().to_string();
    let (key, public) = keypair(dir.path());
    // --certified believes only a signature: without a key it is a usage error.
    assert_exit(&reg.trusted("auth", &["verify", &target, "--certified"]), 2);
    // Before: no certificate, so --certified fails naming the digest.
    let out = reg.trusted(
        "auth",
        &["verify", &target, "--certified", "--key", &public],
    );
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains("no certificate is attached"),
        "{}",
        stdout(&out)
    );

    let cert = dir.path().join("cert.json");
    let out = reg.trusted(
        "auth",
        &[
            "certify",
            &target,
            "--gpus",
            "none",
            "--attach",
            "--key",
            &key,
            "--out",
            &cert.display().to_string(),
        ],
    );
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains("attached the signed certificate"),
        "{}",
        stderr(&out)
    );
    // No probe ran, and the verdict and the certificate say so.
    assert!(
        stdout(&out).contains("certified on the static checks only: no probe ran"),
        "{}",
        stdout(&out)
    );
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cert).unwrap()).unwrap();
    assert_eq!(written["facts"]["scope"]["level"], "static", "{written}");
    assert_eq!(written["facts"]["scope"]["gpus"], "none", "{written}");

    // distribution 2.8 has no referrers API: the artifact is listed in the index under the
    // tag `sha256-<hex>`, which skopeo reads as any other manifest.
    let tag = format!("certified/app:{}", digest.replacen(':', "-", 1));
    let index = reg.skopeo_json(&["--raw"], &tag);
    let listed = &index["manifests"][0];
    assert_eq!(
        listed["artifactType"], "application/vnd.dev.sigstore.bundle.v0.3+json",
        "{index}"
    );
    assert_eq!(
        listed["annotations"]["dev.sigstore.bundle.predicateType"],
        "https://gpubake.io/certificate/v1",
        "{index}"
    );
    assert_eq!(
        listed["annotations"]["io.gpubake.verdict"], "certified",
        "{index}"
    );
    assert_eq!(
        listed["annotations"]["io.gpubake.scope"], "static gpus=none",
        "{index}"
    );
    let artifact = listed["digest"].as_str().unwrap();
    let manifest = reg.skopeo_json(&["--raw"], &format!("certified/app@{artifact}"));
    assert_eq!(manifest["subject"]["digest"], digest.as_str(), "{manifest}");

    let out = reg.trusted("auth", &["inspect", &target, "--json"]);
    assert_exit(&out, 0);
    assert_eq!(json_of(&out)["referrers"][0]["digest"], artifact);
    let out = reg.trusted("auth", &["inspect", &target]);
    assert!(
        stdout(&out).contains(&format!(
            "{artifact} application/vnd.dev.sigstore.bundle.v0.3+json  certified (static gpus=none) [unchecked: an unsigned annotation; inspect --key PUB.pem checks the signature]"
        )),
        "{}",
        stdout(&out)
    );
    // A certificate of the static checks alone does not pass the gate unless asked for.
    let certified = ["verify", &target, "--certified", "--key", &public];
    let out = reg.trusted("auth", &certified);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains("static checks only, no probe ran")
            && stdout(&out).contains("--static-ok"),
        "{}",
        stdout(&out)
    );
    let out = reg.trusted("auth", &[&certified[..], &["--static-ok"]].concat());
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains(&format!(
            "{artifact} certifies {digest}: static checks only, no probe ran (gpus none), signed with the key"
        )),
        "{}",
        stdout(&out)
    );
    assert_exit(&reg.trusted("auth", &["verify", &target, "--static-ok"]), 2);

    // A second attachment adds to the index rather than replacing it.
    let out = reg.trusted(
        "auth",
        &[
            "certify", &target, "--gpus", "none", "--attach", "--key", &key,
        ],
    );
    assert_exit(&out, 0);
    let out = reg.trusted("auth", &["inspect", &target, "--json"]);
    let referrers = json_of(&out)["referrers"].as_array().unwrap().len();
    assert_eq!(referrers, 2);

    // --attach on an image outside a registry is a usage error before any work.
    let out = reg.gpubake(
        "auth",
        &[
            "certify",
            &from_base(),
            "--gpus",
            "none",
            "--attach",
            "--key",
            &key,
        ],
    );
    assert_exit(&out, 2);
    // So is --attach without a key to sign with.
    assert_exit(
        &reg.trusted("auth", &["certify", &target, "--gpus", "none", "--attach"]),
        2,
    );
}

/// A P-256 key pair made by openssl, as PKCS#8 and SubjectPublicKeyInfo PEM files: the
/// private key's path and the public key's.
fn keypair(dir: &Path) -> (String, String) {
    std::fs::create_dir_all(dir).unwrap();
    let sec1 = dir.join("key.sec1.pem");
    let key = dir.join("key.pem");
    let public = dir.join("key.pub");
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", stderr(&out));
    };
    let path = |p: &Path| p.display().to_string();
    openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        &path(&sec1),
    ]);
    openssl(&[
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        &path(&sec1),
        "-out",
        &path(&key),
    ]);
    openssl(&["ec", "-in", &path(&sec1), "-pubout", "-out", &path(&public)]);
    (path(&key), path(&public))
}

/// Attaches to the image `digest` a bundle of a statement of `kind` about `about`, signed
/// with `key`, under `annotations`; the bundle's bytes, as the registry now stores them.
fn attach_signed(
    reg: &Registry,
    target: &str,
    (digest, about): (&str, &str),
    key: &gpubake::sign::keys::PrivateKey,
    (kind, predicate): (&str, Value),
    annotations: std::collections::BTreeMap<String, String>,
) -> Vec<u8> {
    use gpubake::sign::bundle::{self, Bundle};
    use gpubake::sign::statement::{Descriptor, Statement};
    let statement = Statement::new(vec![Descriptor::of("forged", about)], kind, predicate);
    let bytes = serde_json::to_vec(&Bundle::sign(&statement, key)).unwrap();
    gpubake::image::referrers::attach(
        &remote_of(reg, target),
        &digest.parse::<gpubake::image::digest::Digest>().unwrap(),
        bundle::MEDIA_TYPE,
        &bytes,
        annotations,
    )
    .unwrap();
    bytes
}

/// [`attach_signed`] of a certificate, without annotations.
fn attach_bundle(
    reg: &Registry,
    target: &str,
    digest: &str,
    about: &str,
    key: &gpubake::sign::keys::PrivateKey,
    predicate: Value,
) -> Vec<u8> {
    let kind = gpubake::certify::CERTIFICATE_PREDICATE;
    attach_signed(
        reg,
        target,
        (digest, about),
        key,
        (kind, predicate),
        Default::default(),
    )
}

/// The library's view of `target` (`docker://ADDR/NAME:TAG`) with the test's login.
fn remote_of(reg: &Registry, target: &str) -> gpubake::image::registry::Remote {
    gpubake::image::registry::Remote {
        reference: target.trim_start_matches("docker://").to_string(),
        access: gpubake::image::registry::Access {
            cert_dir: Some(PathBuf::from(reg.certs())),
            authfile: Some(reg.dir.path().join("auth/config.json")),
            ..Default::default()
        },
    }
}

#[test]
fn a_certificate_is_believed_only_signed_with_the_key_for_this_digest_and_passing() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let target = reg.image("forged/app:v1");
    let (key, public) = keypair(dir.path());
    // The build signs its provenance and attaches it beside the image.
    let provenance = dir.path().join("provenance.json");
    let provenance_arg = provenance.display().to_string();
    let signing = [
        "--json",
        "--key",
        key.as_str(),
        "--provenance",
        provenance_arg.as_str(),
    ];
    let out = reg.trusted(
        "auth",
        &build_args(&recipe, &from_base(), &target, &signing),
    );
    assert_exit(&out, 0);
    let digest = json_of(&out)["manifest"].as_str().unwrap().to_string();
    assert!(
        stderr(&out).contains("attached the signed provenance"),
        "{}",
        stderr(&out)
    );
    let bundle =
        gpubake::sign::bundle::Bundle::from_slice(&std::fs::read(&provenance).unwrap()).unwrap();
    let public_key = gpubake::sign::keys::PublicKey::read(Path::new(&public)).unwrap();
    let statement = bundle.verify(&public_key).unwrap();
    assert!(statement.about(&digest));
    assert_eq!(statement.predicate_type, "https://slsa.dev/provenance/v1");
    // And the image's own signature, where podman and skopeo look for it.
    let sig_tag = format!("forged/app:{}.sig", digest.replacen(':', "-", 1));
    let signatures = reg.skopeo_json(&["--raw"], &sig_tag);
    assert_eq!(
        signatures["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let layer = &signatures["layers"][0];
    assert_eq!(
        layer["mediaType"], "application/vnd.dev.cosign.simplesigning.v1+json",
        "{signatures}"
    );
    let payload_digest = layer["digest"].as_str().unwrap();
    let hex = payload_digest.trim_start_matches("sha256:");
    let blob = reg.dir.path().join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    let payload = std::fs::read(&blob).unwrap();
    let said: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(
        said["critical"]["image"]["docker-manifest-digest"],
        digest.as_str()
    );
    assert_eq!(
        said["critical"]["identity"]["docker-reference"],
        target.trim_start_matches("docker://")
    );
    let signature = layer["annotations"]["dev.cosignproject.cosign/signature"]
        .as_str()
        .unwrap();
    let signature = gpubake::sign::dsse::decode(signature).unwrap();
    public_key.verify(&payload, &signature).unwrap();
    assert!(public_key.verify(b"another payload", &signature).is_err());
    let out = reg.trusted("auth", &["verify", &target, "--key", &public]);
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains(&format!("{digest} is signed with the key")),
        "{}",
        stdout(&out)
    );
    let (_, stranger) = keypair(&dir.path().join("stranger"));
    let out = reg.trusted("auth", &["verify", &target, "--key", &stranger]);
    assert_exit(&out, 1);
    assert!(stdout(&out).contains("none accepted"), "{}", stdout(&out));
    let cert = dir.path().join("cert.json");
    let out = reg.trusted(
        "auth",
        &[
            "certify",
            &target,
            "--gpus",
            "none",
            "--out",
            &cert.display().to_string(),
        ],
    );
    assert_exit(&out, 0);
    let real: Value = serde_json::from_slice(&std::fs::read(&cert).unwrap()).unwrap();
    let predicate = |verdict: &str| serde_json::json!({"verdict": verdict, "certificate": real, "policy": {"sha256": "0"}});
    let verify = || {
        let out = reg.trusted(
            "auth",
            &[
                "verify",
                &target,
                "--certified",
                "--key",
                &public,
                "--static-ok",
            ],
        );
        assert_exit(&out, 1);
        stdout(&out)
    };
    // An unsigned certificate, as certify attached them before it signed.
    gpubake::image::referrers::attach(
        &remote_of(&reg, &target),
        &digest.parse::<gpubake::image::digest::Digest>().unwrap(),
        gpubake::image::referrers::CERTIFICATE_TYPE,
        &serde_json::to_vec(&real).unwrap(),
        std::collections::BTreeMap::from([("io.gpubake.verdict".into(), "certified".into())]),
    )
    .unwrap();
    assert!(verify().contains("an unsigned certificate"), "{}", verify());
    // Signed with another key.
    let other = gpubake::sign::keys::PrivateKey::generate();
    attach_bundle(
        &reg,
        &target,
        &digest,
        &digest,
        &other,
        predicate("certified"),
    );
    assert!(verify().contains("signed with another key"), "{}", verify());
    // A provenance signed with another key (another builder's) is no certificate at all:
    // not counted among those refused below.
    let slsa = "https://slsa.dev/provenance/v1";
    attach_signed(
        &reg,
        &target,
        (&digest, &digest),
        &other,
        (slsa, serde_json::json!({})),
        gpubake::sign::bundle::annotations(slsa, "2026-12-03T00:00:00Z"),
    );
    // Signed with the key, for another image.
    let mine = gpubake::sign::keys::PrivateKey::read(Path::new(&key), b"").unwrap();
    let elsewhere = format!("sha256:{}", "ab".repeat(32));
    attach_bundle(
        &reg,
        &target,
        &digest,
        &elsewhere,
        &mine,
        predicate("certified"),
    );
    assert!(
        verify().contains(&format!("it is signed for {elsewhere}, not {digest}")),
        "{}",
        verify()
    );
    // Signed with the key, for this image, with a failed verdict.
    attach_bundle(&reg, &target, &digest, &digest, &mine, predicate("failed"));
    let text = verify();
    assert!(
        text.contains("its verdict is failed") && text.contains("4 certificate(s)"),
        "{text}"
    );

    // The real one, signed: accepted, and the policy can be asked for.
    let out = reg.trusted(
        "auth",
        &[
            "certify", &target, "--gpus", "none", "--attach", "--key", &key,
        ],
    );
    assert_exit(&out, 0);
    let passing = [
        "verify",
        &target,
        "--certified",
        "--key",
        &public,
        "--static-ok",
    ];
    assert_exit(&reg.trusted("auth", &passing), 0);
    // A referrer whose content the registry no longer serves whole (its blob changed in
    // storage) is refused on its own: the good certificate beside it still counts.
    let broken = attach_bundle(
        &reg,
        &target,
        &digest,
        &digest,
        &other,
        predicate("certified"),
    );
    let hex = gpubake::image::digest::Digest::of(&broken)
        .hex()
        .to_string();
    let stored = reg.dir.path().join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    std::fs::remove_file(&stored).unwrap();
    // Longer than its descriptor says: reading stops at the size it was promised.
    std::fs::write(&stored, vec![b'x'; broken.len() + 4096]).unwrap();
    let out = reg.trusted("auth", &passing);
    assert_exit(&out, 0);
    let out = reg.trusted(
        "auth",
        &["verify", &target, "--certified", "--key", &public],
    );
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains("unreadable: ")
            && stdout(&out).contains(&format!(
                "its content, blob sha256:{hex} runs past the {} bytes",
                broken.len()
            )),
        "{}",
        stdout(&out)
    );
    // A policy judges the probe's measurements: a certificate of the static checks alone
    // meets no policy asked for, whichever it names (the sha256 comparison itself is
    // certify::tests' on a probed certificate).
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "[]\n").unwrap();
    for required in ["embedded".to_string(), policy.display().to_string()] {
        let out = reg.trusted(
            "auth",
            &[&passing[..], &["--require-policy", &required]].concat(),
        );
        assert_exit(&out, 1);
        assert!(
            stdout(&out).contains("no probe judged by the policy required"),
            "{required}: {}",
            stdout(&out)
        );
    }

    // A tampered image under the same tag is another manifest digest, which nothing
    // certifies: one more file in it.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("extra"), "tampered\n").unwrap();
    let tampered = recipe_in(other.path(), "files:\n  - {src: extra, dest: /extra}\n");
    let out = reg.trusted(
        "auth",
        &build_args(&tampered, &from_base(), &target, &["--json"]),
    );
    assert_exit(&out, 0);
    let other_digest = json_of(&out)["manifest"].as_str().unwrap().to_string();
    assert_ne!(other_digest, digest);
    let out = reg.trusted("auth", &passing);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains(&format!("no certificate is attached to {other_digest}")),
        "{}",
        stdout(&out)
    );
    // Nor did anyone sign it.
    let out = reg.trusted("auth", &["verify", &target, "--key", &public]);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains(&format!("{other_digest} has no signature")),
        "{}",
        stdout(&out)
    );

    // One flipped byte in a layer, as the registry stores it, fails the full re-hash
    // (--blobs) at that layer, whatever is signed; the gate alone reads no layer.
    let manifest = reg.skopeo_json(&["--raw"], "forged/app:v1");
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let hex = layer.trim_start_matches("sha256:");
    let blob = reg.dir.path().join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    common::flip_byte(&blob, 100);
    let mut with_blobs = passing.to_vec();
    with_blobs.push("--blobs");
    let out = reg.trusted("auth", &with_blobs);
    assert_exit(&out, 1);
    assert!(
        stdout(&out).contains("FAIL") && stdout(&out).contains(&layer[..19]),
        "{}",
        stdout(&out)
    );
    // A manifest changed where the registry stores it no longer has the digest it is
    // served under, and is refused before anything of it is believed.
    let hex = other_digest.trim_start_matches("sha256:");
    let stored = reg.dir.path().join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    let mut bytes = std::fs::read(&stored).unwrap();
    let at = bytes.windows(6).position(|w| w == b"layers").unwrap();
    bytes[at] = b'L';
    std::fs::remove_file(&stored).unwrap();
    std::fs::write(&stored, bytes).unwrap();
    let out = reg.trusted("auth", &passing);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains(&format!("the registry says {other_digest}")),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}

#[test]
fn build_sbom_is_written_and_attached_to_the_pushed_image() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let target = reg.image("sbom/app:v1");
    let sbom = dir.path().join("sbom.spdx.json");
    let out = reg.trusted(
        "auth",
        &build_args(
            &recipe,
            &from_base(),
            &target,
            &["--sbom", &sbom.display().to_string(), "--json"],
        ),
    );
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains("attached the SBOM"),
        "{}",
        stderr(&out)
    );
    let manifest = json_of(&out)["manifest"].as_str().unwrap().to_string();
    let doc: Value = serde_json::from_slice(&std::fs::read(&sbom).unwrap()).unwrap();
    assert_eq!(doc["spdxVersion"], "SPDX-2.3");
    assert_eq!(doc["packages"][0]["versionInfo"], manifest.as_str());
    let base = layout_digest(&common::base(), "latest");
    assert_eq!(
        doc["packages"][1]["checksums"][0]["checksumValue"],
        base.trim_start_matches("sha256:")
    );
    // The lock's pins are annotations of the image.
    assert!(
        doc["packages"][0]["annotations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["comment"]
                .as_str()
                .unwrap_or("")
                .starts_with("gpubake:pin:nccl=")),
        "{doc}"
    );
    let out = reg.trusted("auth", &["inspect", &target, "--json"]);
    assert_exit(&out, 0);
    assert_eq!(
        json_of(&out)["referrers"][0]["artifact_type"],
        "application/spdx+json"
    );
}

/// A registry stand-in that answers the OCI 1.1 referrers API, which distribution does not:
/// just enough of the distribution API over TLS for `registry::attach` and
/// `registry::referrers` (every blob is there; manifests are kept; a manifest with a subject
/// is listed under `/referrers/<subject>` and answered with `OCI-Subject`). It records each
/// request line.
struct ReferrersMock {
    addr: String,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    manifests: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>>,
}

impl ReferrersMock {
    fn start(cert: &Path, key: &Path) -> ReferrersMock {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = std::sync::Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(
                    vec![CertificateDer::from_pem_file(cert).unwrap()],
                    PrivateKeyDer::from_pem_file(key).unwrap(),
                )
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mock = ReferrersMock {
            addr,
            requests: Default::default(),
            manifests: Default::default(),
        };
        let (requests, manifests) = (mock.requests.clone(), mock.manifests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let _ = Self::serve(&mut tls, &requests, &manifests);
            }
        });
        mock
    }

    fn serve(
        tls: &mut (impl std::io::Read + std::io::Write),
        requests: &std::sync::Mutex<Vec<String>>,
        manifests: &std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>,
    ) -> std::io::Result<()> {
        use std::io::{BufRead, Read};
        let mut reader = std::io::BufReader::new(&mut *tls);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            if header.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        drop(reader);
        let mut words = line.split_whitespace();
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        requests.lock().unwrap().push(format!("{method} {path}"));
        let path = path.split('?').next().unwrap_or("");
        let parts: Vec<&str> = path.trim_start_matches("/v2/").rsplitn(3, '/').collect();
        let (status, extra, reply): (&str, String, Vec<u8>) = match (method, parts.as_slice()) {
            ("GET", _) if path == "/v2/" => ("200 OK", String::new(), b"{}".to_vec()),
            ("HEAD", [_, "blobs", _]) => ("200 OK", String::new(), Vec::new()),
            ("PUT", [reference, "manifests", name]) => {
                let digest = format!("sha256:{}", Digest::of(&body).hex());
                let value: Value = serde_json::from_slice(&body).unwrap_or_default();
                let mut kept = manifests.lock().unwrap();
                kept.insert(format!("{name}:{reference}"), body.clone());
                kept.insert(format!("{name}@{digest}"), body.clone());
                let subject = value["subject"]["digest"].as_str().map(str::to_string);
                if let Some(subject) = &subject {
                    let entry = serde_json::to_vec(&serde_json::json!({
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": digest, "size": body.len(),
                        "artifactType": value["artifactType"],
                    }))
                    .unwrap();
                    let key = format!("referrers {name}@{subject}");
                    let mut listed = kept.get(&key).cloned().unwrap_or_default();
                    listed.extend_from_slice(&entry);
                    listed.push(b'\n');
                    kept.insert(key, listed);
                }
                let oci_subject = subject
                    .map(|s| format!("OCI-Subject: {s}\r\n"))
                    .unwrap_or_default();
                let location = format!("Location: /v2/{name}/manifests/{digest}\r\n");
                ("201 Created", oci_subject + &location, Vec::new())
            }
            ("GET" | "HEAD", [reference, "manifests", name]) => {
                let sep = if reference.starts_with("sha256:") {
                    '@'
                } else {
                    ':'
                };
                match manifests
                    .lock()
                    .unwrap()
                    .get(&format!("{name}{sep}{reference}"))
                {
                    Some(bytes) => (
                        "200 OK",
                        format!(
                            "Content-Type: {}\r\nDocker-Content-Digest: sha256:{}\r\n",
                            "application/vnd.oci.image.manifest.v1+json",
                            Digest::of(bytes).hex()
                        ),
                        if method == "GET" {
                            bytes.clone()
                        } else {
                            Vec::new()
                        },
                    ),
                    None => ("404 Not Found", String::new(), Vec::new()),
                }
            }
            ("GET", [subject, "referrers", name]) => {
                let listed = manifests
                    .lock()
                    .unwrap()
                    .get(&format!("referrers {name}@{subject}"))
                    .cloned()
                    .unwrap_or_default();
                let entries: Vec<Value> = listed
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(|l| serde_json::from_slice(l).unwrap())
                    .collect();
                let index = serde_json::json!({
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": entries,
                });
                (
                    "200 OK",
                    "Content-Type: application/vnd.oci.image.index.v1+json\r\n".into(),
                    serde_json::to_vec(&index).unwrap(),
                )
            }
            _ => ("404 Not Found", String::new(), Vec::new()),
        };
        write!(
            tls,
            "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
            reply.len()
        )?;
        if method != "HEAD" {
            tls.write_all(&reply)?;
        }
        tls.flush()
    }
}

#[test]
fn a_registry_with_the_referrers_api_lists_the_certificate_without_a_tag_index() {
    use gpubake::image::referrers;
    use gpubake::image::registry::{Access, Remote};
    let Some(reg) = Registry::start() else { return };
    let mock = ReferrersMock::start(
        &reg.dir.path().join("cert.pem"),
        &reg.dir.path().join("key.pem"),
    );
    // The subject: the busybox base's manifest, as the mock keeps it.
    let layout = gpubake::image::layout::Layout::open(&common::base()).unwrap();
    let found = layout.find(Some("latest")).unwrap();
    let subject_bytes = layout
        .read_blob(&gpubake::image::layout::digest_of(&found).unwrap(), None)
        .unwrap();
    let subject = Digest::of(&subject_bytes);
    mock.manifests
        .lock()
        .unwrap()
        .insert(format!("team/app@{subject}"), subject_bytes);
    let remote = Remote {
        reference: format!("{}/team/app:v1", mock.addr),
        access: Access {
            cert_dir: Some(PathBuf::from(reg.certs())),
            ..Access::default()
        },
    };
    let artifact = referrers::attach(
        &remote,
        &subject,
        referrers::CERTIFICATE_TYPE,
        br#"{"checks":[]}"#,
        std::collections::BTreeMap::from([("io.gpubake.verdict".into(), "certified".into())]),
    )
    .unwrap();
    let requests = mock.requests.lock().unwrap().clone();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with(&format!("GET /v2/team/app/referrers/{subject}"))),
        "{requests:#?}"
    );
    // The API listed the artifact, so no tag-schema index was written.
    assert!(
        !requests.iter().any(|r| r.contains("/manifests/sha256-")),
        "{requests:#?}"
    );
    let listed = referrers::referrers(&remote, &subject).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].digest, artifact);
    assert_eq!(listed[0].artifact_type, referrers::CERTIFICATE_TYPE);
}

#[test]
fn bearer_tokens_push_and_pull_with_the_scopes_each_request_needs() {
    let Some(reg) = Registry::start_with(Auth::Token) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base = from_base();
    let want = layout_digest(&common::base(), "latest");
    let first = reg.image("tok/base:1");
    assert_exit(&reg.copy("auth", &base, &first), 0);
    // The push logs in for pull and push on its repository, and asks for no other.
    let asked = reg.token_requests();
    assert!(
        asked.contains(&"repository:tok/base:pull,push".to_string()),
        "{asked:?}"
    );
    assert!(
        asked
            .iter()
            .all(|line| line == "repository:tok/base:pull,push"
                || line == "repository:tok/base:pull"),
        "{asked:?}"
    );
    assert_eq!(reg.skopeo_digest("tok/base:1"), want);

    // Within the registry the blobs are mounted: one token for push on the target and pull
    // on the source, and nothing pushed to the source.
    let out = reg.copy("auth", &first, &reg.image("tok/again:1"));
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains("0 blobs uploaded") && stderr(&out).contains("mounted from tok/base"),
        "{}",
        stderr(&out)
    );
    let asked = reg.token_requests();
    assert!(
        asked.contains(&"repository:tok/again:pull,push repository:tok/base:pull".to_string()),
        "{asked:?}"
    );
    assert!(
        !asked.iter().any(|line| line.contains("tok/base:pull,push")),
        "{asked:?}"
    );
    assert_eq!(reg.skopeo_digest("tok/again:1"), want);

    // Pulled back through the token flow, every blob verified.
    let back = format!("oci:{}:v1", dir.path().join("back").display());
    assert_exit(&reg.copy("auth", &reg.image("tok/again:1"), &back), 0);
    assert_eq!(layout_digest(&dir.path().join("back"), "v1"), want);
    assert!(
        reg.token_requests()
            .iter()
            .all(|line| line == "repository:tok/again:pull"),
    );
    assert_exit(&reg.gpubake("auth", &["verify", &back]), 0);
}

#[test]
fn a_token_server_that_refuses_is_named_and_wrong_passwords_read_as_with_basic_auth() {
    let Some(tokens) = Registry::start_with(Auth::Token) else {
        return;
    };
    let Some(basic) = Registry::start() else {
        return;
    };
    let base = from_base();
    // A wrong password: the same exit code and words whichever way the registry checks it.
    let said: Vec<String> = [&tokens, &basic]
        .iter()
        .map(|reg| {
            let out = reg.copy("wrong", &base, &reg.image("denied/base:1"));
            assert_exit(&out, 2);
            stderr(&out)
                .replace(&reg.addr, "REGISTRY")
                .replace(&reg.dir.path().display().to_string(), "DIR")
        })
        .collect();
    assert_eq!(said[0], said[1]);
    assert!(
        said[0].contains("refused the credentials from DIR/wrong/config.json"),
        "{}",
        said[0]
    );
    // The same for a pull.
    let dir = tempfile::tempdir().unwrap();
    let into = format!("oci:{}:1", dir.path().join("x").display());
    let out = tokens.copy("wrong", &tokens.image("denied/base:1"), &into);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("refused the credentials"),
        "{}",
        stderr(&out)
    );

    // No credentials at all: the token server answers 401, read as the registry's would be.
    let out = tokens.copy("none", &base, &tokens.image("denied/base:1"));
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains("asks for credentials"),
        "{}",
        stderr(&out)
    );

    // A token server that says no (403) is named, with its status and its words.
    let out = tokens.copy(OUTSIDER, &base, &tokens.image("denied/base:1"));
    assert_exit(&out, 2);
    let text = stderr(&out);
    assert!(
        text.contains("the registry's token server http://127.0.0.1:")
            && text.contains("refused a token for repository:denied/base:pull,push")
            && text.contains("HTTP 403")
            && text.contains("outsider may not use this registry"),
        "{text}"
    );
}

/// A registry stand-in over TLS whose manifests and config never end: `endless` answers its
/// manifest with no Content-Length and bytes until the client hangs up, `huge` does the same
/// under a Content-Length of 8 GiB, `config` has a small manifest whose 2-byte config blob is
/// answered endlessly, and `listed` is a whole image whose referrers list never ends. It
/// counts the bytes it got out.
/// `flaky` answers its manifest 500 twice before serving it, `down` answers it 500 always.
struct EndlessMock {
    addr: String,
    sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// How many times each path was asked for.
    asked: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u32>>>,
}

/// What the endless answers are made of: 1 GiB at most, so that a client that read it all
/// would show it in its memory, and the test would still end.
const ENDLESS: u64 = 1 << 30;

impl EndlessMock {
    fn start(dir: &Path) -> EndlessMock {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = std::sync::Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(
                    vec![CertificateDer::from_pem_file(dir.join("cert.pem")).unwrap()],
                    PrivateKeyDer::from_pem_file(dir.join("key.pem")).unwrap(),
                )
                .unwrap(),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mock = EndlessMock {
            addr: listener.local_addr().unwrap().to_string(),
            sent: Default::default(),
            asked: Default::default(),
        };
        let (sent, asked) = (mock.sent.clone(), mock.asked.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (config, sent, asked) = (config.clone(), sent.clone(), asked.clone());
                std::thread::spawn(move || {
                    let conn = rustls::ServerConnection::new(config).unwrap();
                    let mut tls = rustls::StreamOwned::new(conn, stream);
                    let _ = Self::serve(&mut tls, &sent, &asked);
                });
            }
        });
        mock
    }

    fn asked(&self, path: &str) -> u32 {
        self.asked.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn serve(
        tls: &mut (impl std::io::Read + std::io::Write),
        sent: &std::sync::atomic::AtomicU64,
        asked: &std::sync::Mutex<std::collections::HashMap<String, u32>>,
    ) -> std::io::Result<()> {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(&mut *tls);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            if header.trim().is_empty() {
                break;
            }
        }
        drop(reader);
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let times = {
            let mut asked = asked.lock().unwrap();
            let n = asked.entry(path.clone()).or_default();
            *n += 1;
            *n
        };
        let failing = match path.as_str() {
            "/v2/flaky/manifests/1" => times <= 2,
            "/v2/down/manifests/1" => true,
            _ => false,
        };
        if failing {
            // What docker-registry answers when a tag's link file is read empty.
            let body = r#"{"errors":[{"code":"UNKNOWN","message":"unknown error","detail":{}}]}"#;
            write!(
                tls,
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )?;
            return tls.flush();
        }
        let config_digest = format!("sha256:{}", Digest::of(b"{}").hex());
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": 2},
            "layers": [],
        }))
        .unwrap();
        let manifest_type = "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n";
        let (head, small, endless): (String, &[u8], bool) = match path.as_str() {
            "/v2/" => ("Content-Length: 2\r\n".into(), b"{}", false),
            "/v2/endless/manifests/1" => (manifest_type.into(), b"", true),
            "/v2/huge/manifests/1" => (
                format!("{manifest_type}Content-Length: {}\r\n", 8u64 << 30),
                b"",
                true,
            ),
            "/v2/config/manifests/1" | "/v2/listed/manifests/1" | "/v2/flaky/manifests/1" => (
                format!("{manifest_type}Content-Length: {}\r\n", manifest.len()),
                &manifest,
                false,
            ),
            p if p == format!("/v2/config/blobs/{config_digest}") => (String::new(), b"", true),
            p if p == format!("/v2/listed/blobs/{config_digest}")
                || p == format!("/v2/flaky/blobs/{config_digest}") =>
            {
                ("Content-Length: 2\r\n".into(), b"{}", false)
            }
            p if p
                == format!(
                    "/v2/listed/referrers/sha256:{}",
                    Digest::of(&manifest).hex()
                ) =>
            {
                (String::new(), b"", true)
            }
            _ => {
                write!(tls, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")?;
                return tls.flush();
            }
        };
        write!(tls, "HTTP/1.1 200 OK\r\n{head}Connection: close\r\n\r\n")?;
        tls.write_all(small)?;
        if endless {
            // Spaces: a JSON body that could still turn out valid, so only a limit stops it.
            let chunk = vec![b' '; 64 << 10];
            let mut out = 0;
            while out < ENDLESS {
                tls.write_all(&chunk)?;
                out += chunk.len() as u64;
                sent.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        }
        tls.flush()
    }
}

/// The largest resident set of any child this test process has waited for, in bytes.
/// Runs `cmd` and returns its output with its own peak resident memory: wait4 on that child
/// alone, since RUSAGE_CHILDREN would count every child of this test binary, including the
/// builds other tests run beside this one.
#[allow(clippy::zombie_processes)] // wait4 reaps it: clippy knows only Child::wait.
fn output_and_max_rss(cmd: &mut Command) -> (std::process::Output, u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The child's own peak, VmHWM of its memory since exec, polled until it exits. Its rusage
    // would not do: spawned by vfork, a child's ru_maxrss keeps the test process's peak from
    // before exec, which parallel tests make hundreds of MB.
    let status = format!("/proc/{}/status", child.id());
    let (peak, done) = (
        std::sync::Arc::new(AtomicU64::new(0)),
        std::sync::Arc::new(AtomicBool::new(false)),
    );
    let poll = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let hwm = std::fs::read_to_string(&status).ok().and_then(|t| {
                    let line = t.lines().find(|l| l.starts_with("VmHWM:"))?.to_string();
                    line.split_whitespace().nth(1)?.parse::<u64>().ok()
                });
                if let Some(kb) = hwm {
                    peak.fetch_max(kb * 1024, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let out = child.wait_with_output().unwrap();
    done.store(true, Ordering::Relaxed);
    poll.join().unwrap();
    (out, peak.load(Ordering::Relaxed))
}

#[test]
fn an_endless_or_oversized_manifest_or_config_is_refused_without_reading_it() {
    if !common::have("openssl", "version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certificate(dir.path());
    let mock = EndlessMock::start(dir.path());
    let certs = dir.path().join("certs").display().to_string();
    for (name, said) in [
        (
            "endless",
            "manifest 1 runs past 4194304 bytes (reading stopped there), more than the 4194304 \
             bytes a manifest or config may have",
        ),
        (
            "huge",
            "manifest 1 is 8589934592 bytes by its Content-Length, more than the 4194304 bytes",
        ),
        ("config", "longer than the 2 bytes its descriptor says"),
        (
            "listed",
            "the referrers list runs past 4194304 bytes (reading stopped there)",
        ),
    ] {
        let before = mock.sent.load(std::sync::atomic::Ordering::Relaxed);
        let start = Instant::now();
        let reference = format!("docker://{}/{name}:1", mock.addr);
        let (out, rss) = output_and_max_rss(
            Command::new(env!("CARGO_BIN_EXE_gpubake"))
                .args(["inspect", &reference, "--cert-dir", &certs])
                .env("DOCKER_CONFIG", dir.path())
                .env("GPUBAKE_CACHE_DIR", dir.path().join("cache")),
        );
        let took = start.elapsed();
        assert_exit(&out, 2);
        let text = stderr(&out);
        assert!(
            text.contains(&reference) && text.contains(said),
            "{name}: {text}"
        );
        let sent = mock.sent.load(std::sync::atomic::Ordering::Relaxed) - before;
        // Quickly, and with the mock still far from done: the body was not read through.
        assert!(took < Duration::from_secs(30), "{name}: {took:?}");
        assert!(sent < ENDLESS / 4, "{name}: {sent} bytes went out");
        // gpubake's memory stays near the limit's, nowhere near the 1 GiB on offer.
        assert!(rss < 200 << 20, "{name}: {rss} bytes resident");
        eprintln!("{name}: refused in {took:?}; {sent} bytes sent; largest child {rss} bytes");
    }
}

/// A registry that answers a manifest read 500 (as docker-registry does while another client
/// writes the tag) is asked again: a passing failure is not the user's error, and a registry
/// that keeps failing is the environment's (exit 3), named with how often it was asked.
#[test]
fn a_manifest_read_answered_500_is_asked_again_and_a_registry_that_keeps_failing_is_named() {
    if !common::have("openssl", "version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certificate(dir.path());
    let mock = EndlessMock::start(dir.path());
    let certs = dir.path().join("certs").display().to_string();
    let inspect = |name: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpubake"))
            .args(["inspect", &format!("docker://{}/{name}:1", mock.addr)])
            .args(["--cert-dir", &certs])
            .env("DOCKER_CONFIG", dir.path())
            .env("GPUBAKE_CACHE_DIR", dir.path().join("cache"))
            .output()
            .unwrap()
    };
    let out = inspect("flaky");
    // The first two answers were 500s: the third, and any later read, found it.
    assert_exit(&out, 0);
    assert!(mock.asked("/v2/flaky/manifests/1") >= 3);
    let out = inspect("down");
    assert_exit(&out, 3);
    let text = stderr(&out);
    assert!(
        text.contains("manifest 1: HTTP 500 Internal Server Error")
            && text.contains("unknown error")
            && text.contains("(asked 4 times)"),
        "{text}"
    );
    assert_eq!(mock.asked("/v2/down/manifests/1"), 4);
}

#[test]
fn a_recipes_base_is_pulled_from_its_registry_when_build_has_no_from() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let remote_base = reg.image("team/base:1");
    assert_exit(&reg.copy("auth", &from_base(), &remote_base), 0);
    let recipe = write(
        dir.path(),
        "recipe.yaml",
        &format!(
            "name: regtest\nbase: {}/team/base:1\npytorch: '2.9'\npresets: [base]\n",
            reg.addr
        ),
    );
    let mut digests = Vec::new();
    for (name, from) in [("named", Some(remote_base.as_str())), ("recipe", None)] {
        let to = format!("oci:{}:v1", dir.path().join(name).display());
        let mut args = vec!["build", "--without-python", &recipe, "--to", &to, "--json"];
        if let Some(from) = from {
            args.extend(["--from", from]);
        }
        let out = reg.trusted("auth", &args);
        assert_exit(&out, 0);
        digests.push(json_of(&out)["manifest"].as_str().unwrap().to_string());
    }
    assert_eq!(digests[0], digests[1]);
    // The registry's options apply to the recipe's base too: without the certificate, the
    // pull is refused, naming the image and --from.
    let out = reg.gpubake(
        "auth",
        &[
            "build",
            "--without-python",
            &recipe,
            "--to",
            &format!("oci:{}:v1", dir.path().join("untrusted").display()),
        ],
    );
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains(&format!(
            "{remote_base}: the registry's TLS certificate is not trusted"
        )) && stderr(&out).contains("pass --from with a local copy"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_loopback_registry_without_tls_is_reached_over_plain_http_as_docker_reaches_it() {
    let Some(reg) = Registry::plain(None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let layout = dir.path().join("out");
    assert_exit(
        &reg.gpubake(
            "auth",
            &build_args(
                &recipe,
                &from_base(),
                &format!("oci:{}:v1", layout.display()),
                &[],
            ),
        ),
        0,
    );
    let want = layout_digest(&layout, "v1");

    // No option needed on loopback: the base is pushed, built from and built to.
    let base = reg.image("bar/base:1");
    assert_exit(&reg.gpubake("auth", &["copy", &from_base(), &base]), 0);
    let target = reg.image("bar/img:t");
    let out = reg.gpubake("auth", &build_args(&recipe, &base, &target, &["--json"]));
    assert_exit(&out, 0);
    assert_eq!(json_of(&out)["manifest"].as_str(), Some(want.as_str()));
    assert_eq!(reg.skopeo_digest("bar/img:t"), want);

    let out = reg.gpubake("auth", &["inspect", &target, "--json"]);
    assert_exit(&out, 0);
    assert_eq!(json_of(&out)["manifest"].as_str(), Some(want.as_str()));
    // --tls-verify=false, as a skopeo user would write it, reaches it as well.
    assert_exit(
        &reg.gpubake("auth", &["verify", &target, "--tls-verify=false"]),
        0,
    );
    let back = dir.path().join("back");
    let out = reg.gpubake(
        "auth",
        &["copy", &target, &format!("oci:{}:v1", back.display())],
    );
    assert_exit(&out, 0);
    assert_eq!(layout_digest(&back, "v1"), want);

    let (key, public) = keypair(dir.path());
    let out = reg.gpubake(
        "auth",
        &[
            "certify", &target, "--gpus", "none", "--attach", "--key", &key,
        ],
    );
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains("attached the signed certificate"),
        "{}",
        stderr(&out)
    );
    assert_exit(
        &reg.gpubake(
            "auth",
            &[
                "verify",
                &target,
                "--certified",
                "--key",
                &public,
                "--static-ok",
            ],
        ),
        0,
    );
    let tag = format!("bar/img:{}", want.replacen(':', "-", 1));
    let index = reg.skopeo_json(&["--raw"], &tag);
    assert_eq!(
        index["manifests"][0]["artifactType"], "application/vnd.dev.sigstore.bundle.v0.3+json",
        "{index}"
    );
}

#[test]
fn a_plain_http_registry_off_loopback_is_named_and_gets_credentials_only_when_marked_insecure() {
    let Some(ns) = Namespace::make(1) else { return };
    let Some(reg) = Registry::plain(Some(ns)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let target = reg.image("bar/base:1");

    // HTTPS to a plain-HTTP port is named for what it is, with the option that fixes it.
    let out = reg.gpubake("auth", &["copy", &from_base(), &target]);
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains(&format!(
            "{} answers plain HTTP: use --tls-verify=false",
            reg.addr
        )),
        "{}",
        stderr(&out)
    );
    assert!(
        !stderr(&out).contains("InvalidContentType"),
        "{}",
        stderr(&out)
    );

    // With --tls-verify=false the password is not sent in clear text to a host off loopback
    // that nobody marked insecure, and the refusal says how to mark it.
    // --tls-verify=false falls back to plain HTTP: without a login the registry's own 401
    // comes back.
    let out = reg.gpubake("none", &["inspect", &target, "--tls-verify=false"]);
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains("asks for credentials and none are configured"),
        "{}",
        stderr(&out)
    );
    let out = reg.gpubake(
        "auth",
        &["copy", &from_base(), &target, "--tls-verify=false"],
    );
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("does not send those from")
            && stderr(&out).contains("over plain HTTP")
            && stderr(&out).contains(&format!("location = \"{}\"", reg.addr)),
        "{}",
        stderr(&out)
    );
    let left = reg.skopeo_inspect(&[], "bar/base:1");
    assert!(
        !left.status.success() && stderr(&left).contains("manifest unknown"),
        "the refused push left an image: {}",
        stderr(&left)
    );

    // Marked insecure in a registries.conf, it gets them: the push goes through, without
    // --tls-verify=false, and skopeo given the same file reads the image gpubake pushed.
    let conf = write(
        dir.path(),
        "registries.conf",
        &format!(
            "[[registry]]\nlocation = \"{}\"\ninsecure = true\n",
            reg.addr
        ),
    );
    let out = reg.gpubake(
        "auth",
        &["copy", &from_base(), &target, "--registries-conf", &conf],
    );
    assert_exit(&out, 0);
    let want = layout_digest(&common::base(), "latest");
    let skopeo = run(Command::new("skopeo")
        .args(["--registries-conf", &conf, "inspect"])
        .args(["--creds", &format!("{USER}:{PASSWORD}")])
        .arg(&target));
    let skopeo: Value = serde_json::from_str(&skopeo).unwrap();
    assert_eq!(skopeo["Digest"].as_str(), Some(want.as_str()));

    // Or listed in docker's insecure-registries, here as the namespace's subnet.
    let daemon = write(
        dir.path(),
        "daemon.json",
        r#"{"insecure-registries": ["10.234.1.0/24"]}"#,
    );
    let out = reg
        .command("auth", &["inspect", &target, "--json"])
        .env("GPUBAKE_DOCKER_DAEMON_JSON", &daemon)
        .output()
        .unwrap();
    assert_exit(&out, 0);
    assert_eq!(json_of(&out)["manifest"].as_str(), Some(want.as_str()));
}

#[test]
fn a_token_server_over_plain_http_off_loopback_gets_the_password_only_when_marked_insecure() {
    let Some(ns) = Namespace::make(2) else { return };
    let Some(reg) = Registry::start_as(Auth::Token, Wire::Tls, Some(ns)) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let target = reg.image("tokens/base:1");
    // The registry speaks HTTPS (its certificate names 127.0.0.1, hence --tls-verify=false);
    // its token server, at 10.234.2.2, plain HTTP.
    let out = reg.gpubake(
        "auth",
        &["copy", &from_base(), &target, "--tls-verify=false"],
    );
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains(&format!(
            "its token server http://{}:",
            reg.addr.trim_end_matches(":5000")
        )) && stderr(&out).contains("does not send those from"),
        "{}",
        stderr(&out)
    );
    assert_eq!(reg.token_requests(), Vec::<String>::new());

    let conf = write(
        dir.path(),
        "registries.conf",
        &format!(
            "[[registry]]\nlocation = \"{}\"\ninsecure = true\n",
            reg.addr
        ),
    );
    let out = reg.gpubake(
        "auth",
        &["copy", &from_base(), &target, "--registries-conf", &conf],
    );
    assert_exit(&out, 0);
    assert!(!reg.token_requests().is_empty());
    // An explicit --tls-verify=true checks a marked registry too, as skopeo reads it.
    let out = reg.gpubake(
        "auth",
        &[
            "inspect",
            &target,
            "--registries-conf",
            &conf,
            "--tls-verify=true",
        ],
    );
    assert_exit(&out, 3);
    assert!(
        stderr(&out).contains("TLS certificate is not trusted"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        // skopeo too skips verifying a registry its registries.conf marks insecure.
        reg.skopeo_json(&["--registries-conf", &conf], "tokens/base:1")["Digest"],
        layout_digest(&common::base(), "latest")
    );
}

#[test]
fn a_tampered_archive_is_not_pushed_and_a_refused_push_shows_no_upload_state() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.tar");
    common::skopeo_archive(&good);
    let bad = dir.path().join("bad.tar");
    common::tampered_archive(&good, &bad);
    let out = reg.copy(
        "auth",
        &format!("docker-archive:{}", bad.display()),
        &reg.image("team/t:1"),
    );
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("but the config says"),
        "{}",
        stderr(&out)
    );
    let out = reg.skopeo_inspect(&[], "team/t:1");
    assert!(!out.status.success(), "a refused copy left a tag");

    // A blob changed on disk after the image was read: the push checks it as it streams and
    // stops before the registry has it whole (the digest is not the content's), and the
    // message names the blob and what it holds, without the upload URL's state token.
    let (image, layer, blob) = base_copy(&dir.path().join("layout"));
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    // A new file: the blob's hard links elsewhere keep their bytes.
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(&blob, bytes).unwrap();
    let remote = gpubake::image::registry::Remote {
        reference: format!("{}/team/refused:1", reg.addr),
        access: gpubake::image::registry::Access {
            cert_dir: Some(PathBuf::from(reg.certs())),
            authfile: Some(reg.dir.path().join("auth/config.json")),
            ..Default::default()
        },
    };
    let err = gpubake::image::registry::push(&image, &remote)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&layer), "{err}");
    assert!(!err.contains("_state"), "{err}");
    assert!(
        err.contains(&format!("blob {layer} has content sha256:")),
        "{err}"
    );
    assert!(!reg.skopeo_inspect(&[], "team/refused:1").status.success());
}

/// Pushes, with skopeo, the busybox base with a config that lists another diff id for its
/// first layer to `remote`: every blob matches its digest, so skopeo pushes it as it is.
/// Returns that layer's digest.
fn push_wrong_diff_id(reg: &Registry, dir: &Path, remote: &str) -> String {
    use gpubake::image::layout::{Layout, descriptor, digest_of};
    let wrong = dir.join("wrong");
    run(Command::new("cp").arg("-r").arg(common::base()).arg(&wrong));
    let store = Layout::open(&wrong).unwrap();
    let desc = store.find(Some("latest")).unwrap();
    let bytes = store
        .read_blob(&digest_of(&desc).unwrap(), Some(desc.size()))
        .unwrap();
    let mut manifest: Value = serde_json::from_slice(&bytes).unwrap();
    let config_digest: Digest = manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut config: Value =
        serde_json::from_slice(&store.read_blob(&config_digest, None).unwrap()).unwrap();
    config["rootfs"]["diff_ids"][0] = Digest::of(b"another layer").to_string().into();
    let (d, n) = store
        .write_blob(&serde_json::to_vec(&config).unwrap())
        .unwrap();
    manifest["config"]["digest"] = d.to_string().into();
    manifest["config"]["size"] = n.into();
    let (d, n) = store
        .write_blob(&serde_json::to_vec(&manifest).unwrap())
        .unwrap();
    store
        .set_tag(
            &descriptor(oci_spec::image::MediaType::ImageManifest, &d, n),
            "latest",
        )
        .unwrap();
    let reach = match reg.wire {
        Wire::Tls => format!("--dest-cert-dir={}", reg.certs()),
        Wire::Plain => "--dest-tls-verify=false".to_string(),
    };
    run(Command::new("skopeo")
        .args(["copy", &reach])
        .args(["--dest-creds", &format!("{USER}:{PASSWORD}")])
        .arg(format!("oci:{}:latest", wrong.display()))
        .arg(remote));
    manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_registry_image_whose_layer_is_not_its_diff_id_is_not_copied_into_a_layout() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let remote = reg.image("bad/diff:1");
    push_wrong_diff_id(&reg, dir.path(), &remote);

    let fresh = dir.path().join("fresh");
    let out = reg.copy("auth", &remote, &format!("oci:{}:1", fresh.display()));
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("but the config says"),
        "{}",
        stderr(&out)
    );
    assert!(!fresh.exists(), "a refused copy left {}", fresh.display());
    // Into a layout that holds the base already: the blobs the pull added are taken away.
    let existing = dir.path().join("existing");
    assert_exit(
        &reg.gpubake(
            "auth",
            &[
                "copy",
                &from_base(),
                &format!("oci:{}:base", existing.display()),
            ],
        ),
        0,
    );
    let before = common::layout_state(&existing);
    let out = reg.copy("auth", &remote, &format!("oci:{}:1", existing.display()));
    assert_exit(&out, 2);
    assert_eq!(common::layout_state(&existing), before);
}

impl Registry {
    /// The file the registry stores blob `digest` in.
    fn stored_blob(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Flips one byte in the middle of the blob `digest` as the registry stores it, as a disk
    /// or a hand on the storage would.
    fn corrupt_blob(&self, digest: &str) {
        let path = self.stored_blob(digest);
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        std::fs::write(&path, bytes).unwrap();
    }

    /// The layer digests of `name`'s manifest, as the registry stores it.
    fn layer_digests(&self, name: &str) -> Vec<String> {
        self.skopeo_json(&["--raw"], name)["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect()
    }

    /// [`Self::gpubake`] with the `auth` login and the blob cache in `cache`.
    fn with_cache(&self, cache: &Path, args: &[&str]) -> Output {
        self.command("auth", args)
            .env("GPUBAKE_CACHE_DIR", cache)
            .output()
            .expect("the gpubake binary runs")
    }
}

/// `--tls-verify=true` written out means HTTPS with a checked certificate, on loopback too,
/// as skopeo reads it; left out, a loopback registry that speaks plain HTTP is reached so.
#[test]
fn an_explicit_tls_verify_true_means_https_even_on_loopback() {
    let Some(reg) = Registry::plain(None) else {
        return;
    };
    let target = reg.image("tls/base:1");
    assert_exit(&reg.gpubake("auth", &["copy", &from_base(), &target]), 0);
    assert_exit(&reg.gpubake("auth", &["inspect", &target]), 0);

    let skopeo = Command::new("skopeo")
        .args(["inspect", "--tls-verify=true"])
        .args(["--creds", &format!("{USER}:{PASSWORD}")])
        .arg(&target)
        .output()
        .unwrap();
    assert!(
        !skopeo.status.success(),
        "skopeo reached it over plain HTTP"
    );
    for args in [
        vec!["inspect", &target, "--tls-verify=true"],
        vec!["verify", &target, "--tls-verify=true"],
    ] {
        let out = reg.gpubake("auth", &args);
        assert_exit(&out, 3);
        assert!(
            stderr(&out).contains("answers plain HTTP"),
            "{}",
            stderr(&out)
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = reg.gpubake(
        "auth",
        &[
            "copy",
            &from_base(),
            &reg.image("tls/other:1"),
            "--tls-verify=true",
        ],
    );
    assert_exit(&out, 3);
    let out = reg.gpubake(
        "auth",
        &[
            "copy",
            &target,
            &format!("oci:{}:1", dir.path().join("back").display()),
            "--tls-verify=true",
        ],
    );
    assert_exit(&out, 3);
    assert!(!dir.path().join("back").exists());
}

/// A blob the registry serves damaged fails `verify` and `certify` (exit 1, every blob named,
/// as for a layout), however warm the blob cache is: they judge what the registry serves now.
#[test]
fn verify_and_certify_judge_the_bytes_the_registry_serves_not_the_blob_cache() {
    let Some(reg) = Registry::plain(None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let target = reg.image("judge/app:v1");
    let warm = dir.path().join("warm-cache");
    let out = reg.with_cache(&warm, &build_args(&recipe, &from_base(), &target, &[]));
    assert_exit(&out, 0);
    // The cache now holds every blob: inspect and copy read them from there.
    let back = format!("oci:{}:v1", dir.path().join("back").display());
    assert_exit(&reg.with_cache(&warm, &["copy", &target, &back]), 0);
    assert_exit(&reg.with_cache(&warm, &["verify", &target]), 0);

    let layers = reg.layer_digests("judge/app:v1");
    // The top layer holds the lock and /etc/nccl.conf that verify reads back.
    let damaged = layers.last().unwrap().clone();
    reg.corrupt_blob(&damaged);
    let empty = dir.path().join("empty-cache");
    for cache in [&warm, &empty] {
        let out = reg.with_cache(cache, &["verify", &target]);
        assert_exit(&out, 1);
        let text = stdout(&out);
        let failed: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
        assert!(
            failed.iter().any(|l| l.contains(&damaged)),
            "the damaged blob is not named:\n{text}"
        );
        // Every blob has its line, the damaged one failed and the others held.
        for (i, layer) in layers.iter().enumerate() {
            let line = text
                .lines()
                .find(|l| l.contains(&format!("layer {}", i + 1)))
                .unwrap_or_else(|| panic!("no line for layer {}:\n{text}", i + 1));
            assert_eq!(line.starts_with("FAIL"), *layer == damaged, "{line}");
        }
        assert!(text.contains("FAILED"), "{text}");

        let out = reg.with_cache(cache, &["certify", &target, "--gpus", "none"]);
        assert_exit(&out, 1);
    }
    // Judged, the registry's bytes stay out of the blob cache.
    assert!(
        !empty
            .join("layout/blobs/sha256")
            .join(damaged.trim_start_matches("sha256:"))
            .exists()
    );
}

/// The CI gate (`verify --certified --key`, `verify --key`) checks the signature or the
/// certificate against the manifest's digest, which binds every layer, without downloading a
/// layer; `--blobs` adds the full re-hash of what the registry serves.
#[test]
fn the_gate_checks_what_is_signed_for_the_digest_without_downloading_layers() {
    let Some(reg) = Registry::plain(None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let target = reg.image("gate/app:v1");
    let (key, public) = keypair(dir.path());
    let cache = dir.path().join("cache");
    let out = reg.with_cache(
        &cache,
        &build_args(&recipe, &from_base(), &target, &["--key", &key]),
    );
    assert_exit(&out, 0);
    let out = reg.with_cache(
        &cache,
        &[
            "certify", &target, "--gpus", "none", "--attach", "--key", &key,
        ],
    );
    assert_exit(&out, 0);

    // Every layer damaged in the registry's storage: a gate that read one would fail.
    let layers = reg.layer_digests("gate/app:v1");
    for layer in &layers {
        reg.corrupt_blob(layer);
    }
    let fresh = dir.path().join("fresh-cache");
    let certified = [
        "verify",
        &target,
        "--certified",
        "--key",
        &public,
        "--static-ok",
    ];
    for gate in [&certified[..], &["verify", &target, "--key", &public]] {
        let start = Instant::now();
        let out = reg.with_cache(&fresh, gate);
        let took = start.elapsed();
        assert_exit(&out, 0);
        let text = stdout(&out);
        assert!(
            text.contains(&format!("{} not downloaded", layers.len())),
            "{text}"
        );
        eprintln!("{gate:?}: {:.2} s", took.as_secs_f64());
        // The full re-hash is its own step, and judges the registry's bytes.
        let mut with_blobs = gate.to_vec();
        with_blobs.push("--blobs");
        let out = reg.with_cache(&fresh, &with_blobs);
        assert_exit(&out, 1);
        let text = stdout(&out);
        for layer in &layers {
            assert!(
                text.lines()
                    .any(|l| l.starts_with("FAIL") && l.contains(layer)),
                "{layer} is not named:\n{text}"
            );
        }
    }
}

/// The names of the files created or moved into `dir` (not below it) while `during` runs.
fn names_landing_in(dir: &Path, during: impl FnOnce()) -> Vec<String> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: inotify_init1 and inotify_add_watch take no pointers but the path, a valid C
    // string that outlives the call.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(fd >= 0, "inotify_init1 failed");
    let watch =
        unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) };
    assert!(watch >= 0, "inotify_add_watch failed");
    during();
    let mut names = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: the buffer is valid for its length; the descriptor is ours and open.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut at = 0;
        let header = std::mem::size_of::<libc::inotify_event>();
        while at + header <= n as usize {
            // The name's length sits after wd, mask and cookie, four bytes each.
            let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
            let name = &buf[at + header..at + header + len];
            let end = name.iter().position(|&b| b == 0).unwrap_or(len);
            names.push(String::from_utf8_lossy(&name[..end]).into_owned());
            at += header + len;
        }
    }
    // SAFETY: closes the descriptor opened above, once.
    unsafe { libc::close(fd) };
    names
}

/// A pull checks each layer (digest, tar stream, diff id) while it streams into a temporary
/// file, which takes the blob's name only when all hold: a layer that is not its diff id
/// never appears in the layout, even for a moment.
#[test]
fn a_pulled_layer_is_checked_as_it_streams_and_lands_only_when_it_holds() {
    let Some(reg) = Registry::plain(None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let remote = reg.image("bad/diff:1");
    let layer = push_wrong_diff_id(&reg, dir.path(), &remote);
    let layout = dir.path().join("existing");
    gpubake::image::layout::Layout::create(&layout).unwrap();
    let mut out = None;
    let landed = names_landing_in(&layout.join("blobs/sha256"), || {
        out = Some(reg.gpubake(
            "auth",
            &["copy", &remote, &format!("oci:{}:1", layout.display())],
        ));
    });
    let out = out.unwrap();
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("but the config says"),
        "{}",
        stderr(&out)
    );
    let hex = layer.trim_start_matches("sha256:");
    assert!(
        !landed.iter().any(|n| n == hex),
        "the bad layer took its name in the layout before it was checked: {landed:?}"
    );
    // The watch saw blobs land: the config, which holds (blobs are written beside
    // index.json and take their name here only once checked).
    assert!(
        landed.iter().any(|n| n.len() == 64 && n != hex),
        "{landed:?}"
    );
}

/// A push reads each blob once, checking it as it streams up: a layer that can be read only
/// once (a FIFO written once) is pushed, and the image arrives whole.
/// A copy of the busybox test base at `layout`, read back: the image, its first layer's
/// digest and that layer's blob file, for a test that changes the blob under the image.
fn base_copy(layout: &Path) -> (gpubake::image::Image, String, PathBuf) {
    run(Command::new("cp").arg("-r").arg(common::base()).arg(layout));
    let source: gpubake::image::Transport =
        format!("oci:{}:latest", layout.display()).parse().unwrap();
    let image = source.open().unwrap();
    let layer = image.manifest().layers()[0].digest().to_string();
    let blob = layout
        .join("blobs/sha256")
        .join(layer.trim_start_matches("sha256:"));
    (image, layer, blob)
}

#[test]
fn a_push_reads_each_blob_once() {
    let Some(reg) = Registry::plain(None) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("once");
    let (_, layer, blob) = base_copy(&layout);
    let bytes = std::fs::read(&blob).unwrap();
    std::fs::remove_file(&blob).unwrap();
    let fifo = std::ffi::CString::new(blob.display().to_string()).unwrap();
    // SAFETY: mkfifo takes a valid C string that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let writer = std::thread::spawn(move || {
        // Opening blocks until gpubake opens the FIFO to read; the bytes go out once.
        std::fs::write(&blob, bytes).unwrap();
    });
    let target = reg.image("once/base:1");
    let mut child = reg
        .command(
            "auth",
            &["copy", &format!("oci:{}:latest", layout.display()), &target],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the copy waited for a second read of {layer}:\n{}",
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 0);
    writer.join().unwrap();
    assert_eq!(
        reg.skopeo_digest("once/base:1"),
        layout_digest(&common::base(), "latest")
    );
}

/// Runs a build as a CI runner would: `args`, with the registry's login and certificate, and
/// `GPUBAKE_CACHE_DIR` at `cache` (a fresh runner has none yet). Returns the output.
fn runner(reg: &Registry, cache: &Path, args: &[&str]) -> Output {
    let certs = reg.certs();
    let mut args = args.to_vec();
    args.extend(["--cert-dir", &certs]);
    reg.command("auth", &args)
        .env("GPUBAKE_CACHE_DIR", cache)
        .output()
        .expect("the gpubake binary runs")
}

/// Each layer of a build's report that is not the base's, with where it came from.
fn new_layers(report: &Value) -> Vec<(String, String, String)> {
    report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["from"] != "base")
        .map(|l| {
            let s = |k: &str| l[k].as_str().unwrap().to_string();
            (s("name"), s("digest"), s("from"))
        })
        .collect()
}

/// `--cache-to` records a build's layers in the registry and `--cache-from` takes them on a
/// runner whose cache is empty: the digest of the same build from a warm local cache, no
/// layer written; where the destination's image already pairs each blob with its diff ID,
/// no layer blob is read at all. A changed preset value writes the presets layer alone.
#[test]
fn a_fresh_runner_builds_from_the_registrys_layer_cache() {
    let Some(reg) = Registry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "env:\n  NCCL_DEBUG: WARN\n");
    let base = from_base();
    let (app, app2, cache) = (
        reg.image("team/app:v1"),
        reg.image("team/app:v2"),
        reg.image("team/cache:main"),
    );
    let warm = dir.path().join("warm");
    let out = runner(
        &reg,
        &warm,
        &build_args(&recipe, &base, &app, &["--json", "--cache-to", &cache]),
    );
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains("2 layers of this build recorded"),
        "{}",
        stderr(&out)
    );
    let built = json_of(&out);
    let want = built["manifest"].as_str().unwrap().to_string();
    let layers = new_layers(&built);
    assert_eq!(layers.len(), 2, "{built}");

    // The artifact: a manifest of the cache's type whose first blob is the records and whose
    // others include every layer blob recorded, so the registry keeps them.
    let raw = reg.skopeo_json(&["--raw"], "team/cache:main");
    assert_eq!(
        raw["artifactType"],
        "application/vnd.gpubake.layer-cache.v1"
    );
    assert_eq!(
        raw["layers"][0]["mediaType"],
        "application/vnd.gpubake.layer-cache.records.v1+json"
    );
    for (name, digest, _) in &layers {
        assert!(
            raw["layers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["digest"] == digest.as_str()),
            "{name}: {raw}"
        );
    }

    // A fresh runner, a new tag: every layer from the registry cache, and no layer blob
    // read, the image the records name pairing each blob with its diff ID.
    let fresh = dir.path().join("fresh");
    let out = runner(
        &reg,
        &fresh,
        &build_args(&recipe, &base, &app2, &["--json", "--cache-from", &cache]),
    );
    assert_exit(&out, 0);
    let report = json_of(&out);
    assert_eq!(report["manifest"].as_str(), Some(want.as_str()));
    for (name, _, from) in new_layers(&report) {
        assert_eq!(from, "registry-cache", "{name}: {}", stderr(&out));
    }
    assert_eq!(reg.skopeo_digest("team/app:v2"), want);
    let unread = |runner: &Path| {
        for (name, digest, _) in &layers {
            let hex = digest.strip_prefix("sha256:").unwrap();
            let blob = runner.join("layout/blobs/sha256").join(hex);
            assert!(!blob.exists(), "{name}'s blob was read: {}", blob.display());
        }
    };
    unread(&fresh);

    // Another fresh runner, to the tag that holds the image: nothing of a layer is read either.
    let again = dir.path().join("again");
    let out = runner(
        &reg,
        &again,
        &build_args(&recipe, &base, &app, &["--json", "--cache-from", &cache]),
    );
    assert_exit(&out, 0);
    assert_eq!(json_of(&out)["manifest"].as_str(), Some(want.as_str()));
    unread(&again);

    // The same build from the warm local cache gives that digest too.
    let layout = dir.path().join("out");
    let to = format!("oci:{}:v1", layout.display());
    let out = runner(&reg, &warm, &build_args(&recipe, &base, &to, &["--json"]));
    assert_exit(&out, 0);
    assert_eq!(json_of(&out)["manifest"].as_str(), Some(want.as_str()));

    // A preset value changed: its layer is written, the probe's comes from the cache, and
    // the image is the one the warm runner builds of the changed recipe.
    let changed = recipe_in(&dir.path().join("changed"), "env:\n  NCCL_DEBUG: INFO\n");
    let out = runner(&reg, &warm, &build_args(&changed, &base, &to, &["--json"]));
    assert_exit(&out, 0);
    let want = json_of(&out)["manifest"].as_str().unwrap().to_string();
    let out = runner(
        &reg,
        &dir.path().join("changed/cache"),
        &build_args(&changed, &base, &app, &["--json", "--cache-from", &cache]),
    );
    assert_exit(&out, 0);
    let report = json_of(&out);
    assert_eq!(report["manifest"].as_str(), Some(want.as_str()));
    let froms: Vec<(String, String)> = new_layers(&report)
        .into_iter()
        .map(|(name, _, from)| (name, from))
        .collect();
    assert_eq!(
        froms,
        [
            ("probe".to_string(), "registry-cache".to_string()),
            ("presets".to_string(), "written".to_string())
        ]
    );
    // What the registry serves is the image: verify reads and hashes every blob of it.
    assert_exit(
        &reg.gpubake("auth", &["verify", &app, "--tls-verify=false"]),
        0,
    );
}

/// gpubake with `GPUBAKE_CACHE_DIR` at `cache`, for a registry that needs no login.
fn plain_runner(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpubake"))
        .args(args)
        .current_dir(common::root())
        .env("GPUBAKE_CACHE_DIR", cache)
        .env_remove("GPUBAKE_PRESET_PATH")
        .output()
        .expect("the gpubake binary runs")
}

/// The layer cache's manifest under `tag` in `repo` at `addr`, and its records.
fn cache_records(addr: &str, repo: &str, tag: &str) -> (Value, Value) {
    gpubake::net::use_ring();
    let http = reqwest::blocking::Client::new();
    let manifest: Value = http
        .get(format!("http://{addr}/v2/{repo}/manifests/{tag}"))
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .unwrap()
        .json()
        .unwrap();
    let records = manifest["layers"][0]["digest"].as_str().unwrap();
    let records: Value = http
        .get(format!("http://{addr}/v2/{repo}/blobs/{records}"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    (manifest, records)
}

/// Writes `records` as the layer cache under `tag` of `repo` at `addr`, as another tool
/// could: the records blob, then `manifest` with that blob first.
fn forge_cache(addr: &str, repo: &str, tag: &str, manifest: &Value, records: &Value) {
    gpubake::net::use_ring();
    let http = reqwest::blocking::Client::new();
    let body = serde_json::to_vec(records).unwrap();
    let digest = Digest::of(&body);
    let started = http
        .post(format!("http://{addr}/v2/{repo}/blobs/uploads/"))
        .send()
        .unwrap();
    assert!(started.status().is_success(), "{}", started.status());
    let location = started.headers()["location"].to_str().unwrap().to_string();
    let location = if location.starts_with("http") {
        location
    } else {
        format!("http://{addr}{location}")
    };
    let sep = if location.contains('?') { '&' } else { '?' };
    let put = http
        .put(format!("{location}{sep}digest={digest}"))
        .body(body.clone())
        .send()
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    let mut manifest = manifest.clone();
    manifest["layers"][0]["digest"] = Value::from(digest.as_str());
    manifest["layers"][0]["size"] = Value::from(body.len());
    let put = http
        .put(format!("http://{addr}/v2/{repo}/manifests/{tag}"))
        .header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        .body(serde_json::to_vec(&manifest).unwrap())
        .send()
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().unwrap());
}

/// A cache record whose blob is not what it says is found, said (naming the layer and what
/// failed) and its layer built, and the image is still the right one: a digest that names
/// another layer's blob, a wrong diff ID (against the image the record names, against the
/// destination's image, or read on first use when neither holds the blob), a blob the
/// registry does not have.
#[test]
fn a_cache_record_that_is_not_what_it_says_is_named_and_its_layer_built() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry = local_registry::local_registry(dir.path());
    let addr = registry.1.clone();
    let recipe = recipe_in(dir.path(), "");
    let base = from_base();
    let image = |tag: &str| format!("docker://{addr}/app:{tag}");
    let cache = |tag: &str| format!("docker://{addr}/cache:{tag}");
    let out = plain_runner(
        &dir.path().join("warm"),
        &build_args(
            &recipe,
            &base,
            &image("good"),
            &["--json", "--cache-to", &cache("good")],
        ),
    );
    assert_exit(&out, 0);
    let built = json_of(&out);
    let want = built["manifest"].as_str().unwrap().to_string();
    let layers = new_layers(&built);
    let (manifest, records) = cache_records(&addr, "cache", "good");
    let key_of = |digest: &str| {
        records["layers"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, r)| r["digest"] == digest)
            .map(|(k, _)| k.clone())
            .unwrap()
    };
    let (probe, presets) = (key_of(&layers[0].1), key_of(&layers[1].1));

    // Each record names the image the build pushed, whose config vouches for it.
    let image_of = |key: &str| {
        records["layers"][key]["image"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(image_of(&probe).starts_with("app@sha256:"), "{records}");
    let mut wrong = records.clone();
    // The probe's record names the presets layer's blob; the presets' a wrong diff ID.
    wrong["layers"][&probe]["digest"] = records["layers"][&presets]["digest"].clone();
    wrong["layers"][&probe]["size"] = records["layers"][&presets]["size"].clone();
    wrong["layers"][&presets]["diffID"] = records["layers"][&probe]["diffID"].clone();
    forge_cache(&addr, "cache", "wrong", &manifest, &wrong);
    // The same naming no image: only reading the blobs finds them out.
    let mut unvouched = wrong.clone();
    for key in [&probe, &presets] {
        unvouched["layers"][key]
            .as_object_mut()
            .unwrap()
            .remove("image");
    }
    forge_cache(&addr, "cache", "unvouched", &manifest, &unvouched);
    let mut missing = records.clone();
    missing["layers"][&probe]["digest"] = Value::from(Digest::of(b"no such blob").as_str());
    forge_cache(&addr, "cache", "missing", &manifest, &missing);

    // Each on a fresh runner: to a new tag (read on first use), and for the wrong diff ID
    // also to the tag whose image pairs the presets' blob with its real one.
    let named = "the image it names";
    let cases = [
        (
            "unvouched",
            "first",
            vec![
                ("probe", "holds a tar stream"),
                ("presets", "holds a tar stream"),
            ],
        ),
        ("missing", "second", vec![("probe", "blob unknown")]),
        ("wrong", "third", vec![("probe", named), ("presets", named)]),
        (
            "unvouched",
            "good",
            vec![
                ("probe", "the destination's image"),
                ("presets", "the destination's image"),
            ],
        ),
    ];
    for (i, (forged, to, bad)) in cases.iter().enumerate() {
        let out = plain_runner(
            &dir.path().join(format!("fresh{i}")),
            &build_args(
                &recipe,
                &base,
                &image(to),
                &["--json", "--cache-from", &cache(forged)],
            ),
        );
        assert_exit(&out, 0);
        let err = stderr(&out);
        let report = json_of(&out);
        assert_eq!(report["manifest"].as_str(), Some(want.as_str()), "{err}");
        for (name, _, from) in new_layers(&report) {
            let said = bad.iter().find(|(n, _)| *n == name);
            let key = if name == "probe" { &probe } else { &presets };
            match said {
                Some((_, why)) => {
                    assert_eq!(from, "written", "{forged} to {to}: {name}: {err}");
                    let line = err
                        .lines()
                        .find(|l| l.contains(&format!("layer {} is not used", &key[..12])))
                        .unwrap_or_else(|| panic!("{forged} to {to}: {name} unnamed: {err}"));
                    assert!(line.contains(why), "{forged} to {to}: {line}");
                    eprintln!("{line}");
                }
                None => assert_eq!(from, "registry-cache", "{forged} to {to}: {name}: {err}"),
            }
        }
    }
}

/// Two builds that write the same cache at once both end up in it: a write that finds the
/// tag changed under it merges again rather than drop the other build's records.
#[test]
fn concurrent_cache_writes_keep_both_builds_records() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry = local_registry::local_registry(dir.path());
    let addr = registry.1.clone();
    let base = from_base();
    let cache = format!("docker://{addr}/cache:main");
    let mut wanted = Vec::new();
    for round in 0..3 {
        let builds: Vec<std::thread::JoinHandle<Output>> = (0..2)
            .map(|i| {
                let name = format!("r{round}b{i}");
                let recipe = recipe_in(
                    &dir.path().join(&name),
                    &format!("env:\n  TRAINING_RUN: r{round}b{i}\n"),
                );
                let cache_dir = dir.path().join(&name).join("cache");
                let (base, cache) = (base.clone(), cache.clone());
                let to = format!("docker://{addr}/app:{name}");
                std::thread::spawn(move || {
                    plain_runner(
                        &cache_dir,
                        &build_args(&recipe, &base, &to, &["--json", "--cache-to", &cache]),
                    )
                })
            })
            .collect();
        for build in builds {
            let out = build.join().unwrap();
            assert_exit(&out, 0);
            wanted.extend(new_layers(&json_of(&out)));
        }
    }
    let (_, records) = cache_records(&addr, "cache", "main");
    for (name, digest, _) in &wanted {
        assert!(
            records["layers"]
                .as_object()
                .unwrap()
                .values()
                .any(|r| r["digest"] == digest.as_str()),
            "{name} {digest} is not recorded: {records}"
        );
    }
}

/// With bearer tokens the cache works across repositories: a fresh runner's build into
/// another repository mounts each layer blob from the cache's repository, with one token for
/// push on the destination and pull on the cache, and reads none of them.
#[test]
fn the_layer_cache_mounts_across_repositories_with_bearer_tokens() {
    let Some(reg) = Registry::start_with(Auth::Token) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe_in(dir.path(), "");
    let base = from_base();
    let cache = reg.image("ci/cache:main");
    let out = runner(
        &reg,
        &dir.path().join("warm"),
        &build_args(
            &recipe,
            &base,
            &reg.image("ci/app:v1"),
            &["--json", "--cache-to", &cache],
        ),
    );
    assert_exit(&out, 0);
    let built = json_of(&out);
    let want = built["manifest"].as_str().unwrap().to_string();
    reg.token_requests();
    let fresh = dir.path().join("fresh");
    let out = runner(
        &reg,
        &fresh,
        &build_args(
            &recipe,
            &base,
            &reg.image("other/app:v1"),
            &["--json", "--cache-from", &cache],
        ),
    );
    assert_exit(&out, 0);
    let report = json_of(&out);
    assert_eq!(report["manifest"].as_str(), Some(want.as_str()));
    for (name, digest, from) in new_layers(&report) {
        assert_eq!(from, "registry-cache", "{name}: {}", stderr(&out));
        let blob = fresh
            .join("layout/blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap());
        assert!(!blob.exists(), "{name}'s blob was read");
    }
    let asked = reg.token_requests();
    assert!(
        asked.iter().any(|line| {
            line.contains("repository:other/app:pull,push")
                && line.contains("repository:ci/cache:pull")
        }),
        "{asked:?}"
    );
    assert_eq!(reg.skopeo_digest("other/app:v1"), want);
}

/// A cache serves destinations other than a registry too, and eStargz layers with their TOC
/// annotations: a fresh runner's build into an OCI layout downloads each blob once, checks
/// it, and writes the image the recording build wrote, which verify accepts. A tag that holds
/// something other than a cache is refused, naming it.
#[test]
fn a_layout_build_takes_estargz_layers_from_the_registry_cache() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry = local_registry::local_registry(dir.path());
    let addr = registry.1.clone();
    let recipe = recipe_in(dir.path(), "");
    let base = from_base();
    let cache = format!("docker://{addr}/cache:main");
    let layout = |name: &str| format!("oci:{}:v1", dir.path().join(name).display());
    let lazy = ["--json", "--compression", "estargz"];
    let args = |to: &str, flag: &str| {
        let mut extra = lazy.to_vec();
        extra.extend([flag, &cache]);
        build_args(&recipe, &base, to, &extra)
            .into_iter()
            .map(str::to_string)
            .collect::<Vec<String>>()
    };
    let run_in = |cache_dir: &str, args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        plain_runner(&dir.path().join(cache_dir), &args)
    };
    let out = run_in("warm", &args(&layout("first"), "--cache-to"));
    assert_exit(&out, 0);
    let first = json_of(&out);
    let out = run_in("fresh", &args(&layout("second"), "--cache-from"));
    assert_exit(&out, 0);
    let second = json_of(&out);
    assert_eq!(second["manifest"], first["manifest"]);
    for (name, digest, from) in new_layers(&second) {
        assert_eq!(from, "registry-cache", "{name}");
        let hex = digest.strip_prefix("sha256:").unwrap();
        assert!(
            dir.path().join("second/blobs/sha256").join(hex).exists(),
            "{name}"
        );
    }
    let raw = run(Command::new("skopeo").args(["inspect", "--raw", &layout("second")]));
    assert!(
        raw.contains("containerd.io/snapshot/stargz/toc.digest"),
        "{raw}"
    );
    assert_exit(&common::gpubake(&["verify", &layout("second")]), 0);

    // A cache the registry cannot serve now is passed over, said; the build goes on.
    let gone = format!("docker://127.0.0.1:{}/cache:main", unused_port());
    let out = plain_runner(
        &dir.path().join("gone"),
        &build_args(
            &recipe,
            &base,
            &layout("gone"),
            &["--json", "--cache-from", &gone],
        ),
    );
    assert_exit(&out, 0);
    assert!(
        stderr(&out)
            .lines()
            .any(|l| l.starts_with(&format!("warning: {gone}: "))
                && l.contains("the layer cache is not read")),
        "{}",
        stderr(&out)
    );

    // A tag that holds an image, not a cache.
    let image = format!("docker://{addr}/app:v1");
    assert_exit(&common::gpubake(&["copy", &layout("first"), &image]), 0);
    let out = plain_runner(
        &dir.path().join("other"),
        &build_args(&recipe, &base, &layout("third"), &["--cache-from", &image]),
    );
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("tag v1 is not a gpubake layer cache"),
        "{}",
        stderr(&out)
    );
}

/// A loopback port nothing listens on.
fn unused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
