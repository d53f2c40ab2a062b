//! The Debian archive client against real archives.
//!
//! Live: Debian's bookworm archive, verified with the host's debian-archive-keyring, resolved
//! against a real bookworm base (scripts/make-debian-base) and compared with apt's own answer
//! for the same base (`apt-get install -s --no-install-recommends`, the host's apt pointed at
//! the base's root): apt is the oracle. Versions are never written here; they come from the
//! index or from apt.
//!
//! Offline: a small archive of real .debs (dpkg-deb), signed with throwaway gpg keys and
//! served by `python3 -m http.server` on loopback, in each way an archive can be wrong.

mod common;

use gpubake::debian::{self, Ask, Client, Keys, Package, Pin, Source};
use sha2::Digest;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const DEBIAN: &str = "http://deb.debian.org/debian";
const HOST_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Every STEP-th name of the archive is compared with apt (about 40 of 66,000).
const STEP: usize = 1500;
const ASKED: [&str; 4] = [
    "rdma-core",
    "ibverbs-providers",
    "numactl",
    "openssh-client",
];

fn asks(list: &[&str]) -> Vec<Ask> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

fn versions(pins: &[Pin]) -> BTreeMap<String, String> {
    pins.iter()
        .map(|p| (p.name.clone(), p.version.clone()))
        .collect()
}

/// True when Debian's archive answers; outside CI its absence skips the live tests.
fn online() -> bool {
    let ok = Client::new(Duration::from_secs(20))
        .unwrap()
        .get(&format!("{DEBIAN}/dists/bookworm/Release.gpg"), 1 << 20)
        .is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI reaches {DEBIAN}; it must"
        );
        eprintln!("skipped: {DEBIAN} is out of reach");
    }
    ok
}

/// The files of the base's one layer an archive client and apt read, unpacked into `dir`.
fn unpack_base(layout: &Path, dir: &Path) {
    let json = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let blob = |digest: &serde_json::Value| {
        layout
            .join("blobs/sha256")
            .join(digest.as_str().unwrap().trim_start_matches("sha256:"))
    };
    let index = json(layout.join("index.json"));
    let manifest = json(blob(&index["manifests"][0]["digest"]));
    let layer = std::fs::File::open(blob(&manifest["layers"][0]["digest"])).unwrap();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(layer));
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().into_owned();
        let path = path.strip_prefix(".").unwrap_or(&path).to_path_buf();
        let wanted = path.starts_with("etc")
            || path == Path::new("var/lib/dpkg/status")
            || path.starts_with("usr/lib/os-release")
            || path.starts_with("usr/share/keyrings");
        if wanted && !entry.header().entry_type().is_block_special() {
            entry.unpack_in(dir).unwrap();
        }
    }
}

/// A real bookworm base, its index as gpubake fetched it, and apt set up over the same root.
struct Live {
    // Kept for its lifetime: the base root apt and gpubake read.
    _root: tempfile::TempDir,
    base: debian::Base,
    available: Vec<Package>,
    apt_config: PathBuf,
}

fn live() -> Option<&'static Live> {
    static LIVE: OnceLock<Option<Live>> = OnceLock::new();
    LIVE.get_or_init(|| {
        if !online() || !common::have("apt-get", "--version") {
            return None;
        }
        let layout = common::debian_base()?;
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        unpack_base(&layout, r);
        for dir in [
            "var/lib/apt/lists/partial",
            "var/cache/apt/archives/partial",
        ] {
            std::fs::create_dir_all(r.join(dir)).unwrap();
        }
        // The host's apt, every directory of it in the base's root (as mmdebstrap runs apt):
        // the base's sources, trusted keys and dpkg status; its own config files stay out.
        let apt_config = r.join("apt.conf");
        std::fs::write(
            &apt_config,
            format!(
                "Dir \"{0}/\";\nDir::State::Status \"{0}/var/lib/dpkg/status\";\n\
                 APT::Architecture \"amd64\";\nAPT::Architectures {{ \"amd64\"; }};\n\
                 APT::Sandbox::User \"root\";\nAcquire::Languages \"none\";\n",
                r.display()
            ),
        )
        .unwrap();
        run(Command::new("apt-get")
            .args(["update", "-q"])
            .env("APT_CONFIG", &apt_config));
        // Right after apt read the archive, so both see the same state of it.
        let base = debian::read_base(r).unwrap();
        let started = std::time::Instant::now();
        let available = debian::fetch_index(
            &Client::new(Duration::from_secs(30)).unwrap(),
            &base.sources,
            &base.arch,
        )
        .unwrap();
        eprintln!(
            "fetched and verified {} packages from {} sources in {:.1?}",
            available.len(),
            base.sources.len(),
            started.elapsed()
        );
        Some(Live {
            _root: root,
            base,
            available,
            apt_config,
        })
    })
    .as_ref()
}

impl Live {
    /// What apt in the base would install for `asks`, name to version; Err with apt's words
    /// when apt refuses.
    fn apt(&self, asks: &[&str]) -> Result<BTreeMap<String, String>, String> {
        let out = Command::new("apt-get")
            .args(["install", "-s", "-q", "--no-install-recommends"])
            .args(asks)
            .env("APT_CONFIG", &self.apt_config)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)));
        }
        assert!(
            !text.contains("\nRemv "),
            "apt would remove packages:\n{text}"
        );
        let inst = regex::Regex::new(r"(?m)^Inst (\S+) (?:\[\S+\] )?\((\S+) ").unwrap();
        Ok(inst
            .captures_iter(&text)
            .map(|c| (c[1].to_string(), c[2].to_string()))
            .collect())
    }

    fn ours(&self, list: &[&str]) -> gpubake::Result<Vec<Pin>> {
        debian::solve(
            &self.base.installed,
            &self.available,
            &asks(list),
            &self.base.arch,
        )
    }

    fn installed(&self, name: &str) -> bool {
        self.base.installed.iter().any(|p| p.name == name)
    }
}

#[test]
fn bookworm_inrelease_verifies_with_the_host_keyring_and_its_index_matches() {
    if !online() {
        return;
    }
    let client = Client::new(Duration::from_secs(30)).unwrap();
    let source = Source {
        uri: DEBIAN.into(),
        suite: "bookworm".into(),
        components: vec!["main".into()],
        keys: Keys::Files(vec![HOST_KEYRING.into()]),
        at: "test".into(),
    };
    let release = debian::release::fetch(&client, &source).unwrap();
    assert_eq!(release.codename.as_deref(), Some("bookworm"));
    assert!(release.components.iter().any(|c| c == "main"));
    let paths = debian::packages::index_paths(&release, "main", "amd64").unwrap();
    assert_eq!(
        paths,
        ["main/binary-amd64/Packages.xz"],
        "xz is taken first"
    );
    let packages = debian::packages::fetch(&client, &release, "main", "amd64").unwrap();
    assert!(packages.len() > 30_000, "{} packages", packages.len());
    for name in ASKED {
        let p = packages.iter().find(|p| p.name == name).unwrap();
        let file = p.file.as_ref().unwrap();
        assert!(file.filename.starts_with("pool/main/"), "{file:?}");
        assert_eq!(file.sha256.len(), 64);
    }
    // The keys Debian has retired do not vouch for today's archive.
    let retired = Source {
        keys: Keys::Files(vec![
            "/usr/share/keyrings/debian-archive-removed-keys.gpg".into(),
        ]),
        ..source
    };
    if Path::new("/usr/share/keyrings/debian-archive-removed-keys.gpg").exists() {
        let e = debian::release::fetch(&client, &retired).unwrap_err();
        assert!(
            e.to_string()
                .contains("bookworm/InRelease: refused: no good signature"),
            "{e}"
        );
    }
}

#[test]
fn the_issue_packages_resolve_as_apt_resolves_them() {
    let Some(live) = live() else { return };
    assert_eq!(live.base.arch, "amd64");
    assert!(
        live.base.sources.len() >= 2,
        "the base's own sources: {:?}",
        live.base.sources
    );
    let pins = live.ours(&ASKED).unwrap();
    let apt = live.apt(&ASKED).unwrap();
    eprintln!(
        "apt installs {} packages, gpubake pins {}: {:?}",
        apt.len(),
        pins.len(),
        versions(&pins)
    );
    assert_eq!(versions(&pins), apt);
    for name in ASKED {
        assert!(pins.iter().any(|p| p.name == name), "{name} is pinned");
    }
    // A dependency comes before what depends on it.
    let at = |n: &str| pins.iter().position(|p| p.name == n);
    if let (Some(lib), Some(tool)) = (at("libnuma1"), at("numactl")) {
        assert!(lib < tool, "libnuma1 before numactl");
    }
    // Every pin's file is the one the index vouches for: fetch one and hash it.
    let small = pins.iter().min_by_key(|p| p.size).unwrap();
    let deb = Client::new(Duration::from_secs(30))
        .unwrap()
        .get(
            &format!("{}/{}", small.base, small.filename),
            small.size + 1,
        )
        .unwrap();
    assert_eq!(deb.len() as u64, small.size);
    assert_eq!(hex::encode(sha2::Sha256::digest(&deb)), small.sha256);
}

#[test]
fn an_exact_version_ask_matches_apt() {
    let Some(live) = live() else { return };
    // A package the sources carry at two versions (bookworm and its updates or security):
    // ask for the older one.
    let mut by_name: BTreeMap<&str, Vec<&Package>> = BTreeMap::new();
    for p in &live.available {
        by_name.entry(&p.name).or_default().push(p);
    }
    let mut tried = 0;
    for (name, versions_of) in by_name {
        let mut vs: Vec<&debversion::Version> = versions_of.iter().map(|p| &p.version).collect();
        vs.sort();
        vs.dedup();
        if vs.len() < 2 || live.installed(name) {
            continue;
        }
        let ask = format!("{name}={}", vs[0]);
        let Ok(apt) = live.apt(&[&ask]) else { continue };
        tried += 1;
        let pins = live.ours(&[&ask]).unwrap();
        assert_eq!(versions(&pins), apt, "{ask}");
        assert_eq!(
            apt[name],
            vs[0].to_string(),
            "the older version, not the candidate"
        );
        if tried == 2 {
            eprintln!(
                "exact-version asks agree with apt, e.g. {ask} ({} packages)",
                pins.len()
            );
            return;
        }
    }
    panic!("no package of the base's sources has two versions apt will install");
}

#[test]
fn a_virtual_package_ask_matches_apt() {
    let Some(live) = live() else { return };
    let real: std::collections::HashSet<&str> =
        live.available.iter().map(|p| p.name.as_str()).collect();
    let mut providers: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in &live.available {
        for rel in p.provides.0.iter().flatten() {
            if !real.contains(rel.name.as_str()) && !live.installed(&p.name) {
                providers.entry(&rel.name).or_default().push(&p.name);
            }
        }
    }
    let installed_provided: std::collections::HashSet<&str> = live
        .base
        .installed
        .iter()
        .flat_map(|p| p.provides.0.iter().flatten().map(|r| r.name.as_str()))
        .collect();
    let mut single = 0;
    let mut several = 0;
    for (virtual_name, mut names) in providers {
        names.sort();
        names.dedup();
        if installed_provided.contains(virtual_name) {
            continue;
        }
        if names.len() == 1 && single < 2 {
            let Ok(apt) = live.apt(&[virtual_name]) else {
                continue;
            };
            let pins = live.ours(&[virtual_name]).unwrap();
            assert_eq!(versions(&pins), apt, "{virtual_name}");
            assert!(apt.contains_key(names[0]), "{virtual_name} -> {}", names[0]);
            eprintln!("virtual {virtual_name} -> {}: agrees with apt", names[0]);
            single += 1;
        } else if names.len() > 2 && several < 1 {
            // apt asks the user to choose, and so does gpubake, naming the providers.
            assert!(live.apt(&[virtual_name]).is_err(), "{virtual_name}");
            let e = live.ours(&[virtual_name]).unwrap_err().to_string();
            assert!(e.contains("is a virtual package provided by"), "{e}");
            assert!(e.contains(names[0]), "{e}");
            several += 1;
        }
        if single == 2 && several == 1 {
            return;
        }
    }
    panic!("found {single} single-provider and {several} multi-provider virtual names");
}

#[test]
fn an_alternative_the_base_already_has_wins_as_in_apt() {
    let Some(live) = live() else { return };
    let mut checked = 0;
    let mut candidates: Vec<&Package> = live.available.iter().collect();
    candidates.sort_by(|a, b| a.name.cmp(&b.name));
    for p in candidates {
        if live.installed(&p.name) {
            continue;
        }
        // An or-group whose first choice the base lacks but a later one it has.
        let group = p.depends.0.iter().find(|g| {
            g.len() > 1
                && !live.installed(&g[0].name)
                && g[1..].iter().any(|r| live.installed(&r.name))
        });
        let Some(group) = group else { continue };
        let Ok(apt) = live.apt(&[&p.name]) else {
            continue;
        };
        let pins = live.ours(&[&p.name]).unwrap();
        assert_eq!(versions(&pins), apt, "{}", p.name);
        assert!(
            !apt.contains_key(&group[0].name),
            "{}: {} is not installed, the base's alternative serves",
            p.name,
            group[0].name
        );
        checked += 1;
        if checked == 3 {
            eprintln!("alternatives the base has win, e.g. {}", p.name);
            return;
        }
    }
    panic!("only {checked} packages with an alternative the base has were found");
}

// --- Offline: a local archive on loopback ---------------------------------------------------

/// Kills what a test started, by its own handle, when the test ends however it ends.
struct Served {
    server: Child,
    homes: Vec<PathBuf>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        for home in &self.homes {
            // gpg started an agent for this home; it stops with it.
            let _ = Command::new("gpgconf")
                .arg("--homedir")
                .arg(home)
                .args(["--kill", "gpg-agent"])
                .output();
        }
    }
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// gpg in batch mode over the keys of `home`.
fn gpg(home: &Path) -> Command {
    let mut cmd = Command::new("gpg");
    cmd.arg("--homedir").arg(home).arg("--batch");
    cmd
}

/// A throwaway signing key in a home of its own; returns its fingerprint.
fn gpg_key(home: &Path, who: &str) -> String {
    std::fs::create_dir_all(home).unwrap();
    std::fs::set_permissions(home, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    run(gpg(home)
        .args(["--passphrase", "", "--quick-gen-key"])
        .arg(format!("{who} <{who}@example.invalid>"))
        .args(["ed25519", "sign", "never"]));
    let listing = String::from_utf8(run(gpg(home).args(["--with-colons", "--list-keys"]))).unwrap();
    listing
        .lines()
        .find_map(|l| l.strip_prefix("fpr:"))
        .map(|l| l.trim_matches(':').to_string())
        .unwrap()
}

/// The package stanzas of the test archive: control fields only (Filename, Size, SHA256 are
/// added from the built .deb).
const CONTROLS: &[(&str, &str, &str)] = &[
    ("hello", "1.0", "Depends: libhello (>= 1.1)\n"),
    ("libhello", "1.2", ""),
    ("clash-a", "1", "Conflicts: clash-b\n"),
    ("clash-b", "1", ""),
    ("breaker", "1", "Breaks: oldtool (<< 2)\n"),
    ("needy", "1", "Depends: middle\n"),
    (
        "middle",
        "1",
        "Depends: absent-lib (>= 3) | libhello (>= 5)\n",
    ),
];

fn date(offset_days: i64) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        + offset_days * 86400;
    let out = run(Command::new("date")
        .arg("-u")
        .arg("-d")
        .arg(format!("@{secs}"))
        .arg("+%a, %d %b %Y %H:%M:%S UTC"));
    String::from_utf8(out).unwrap().trim().to_string()
}

struct Local {
    _dir: tempfile::TempDir,
    _served: Served,
    uri: String,
    armored: PathBuf,
    binary: PathBuf,
    root: PathBuf,
}

/// Builds, signs and serves the test archive: suite `good` and one suite per defect.
fn local() -> Option<Local> {
    for (tool, arg) in [
        ("gpg", "--version"),
        ("gpgconf", "--version"),
        ("dpkg-deb", "--version"),
        ("xz", "--version"),
        ("python3", "--version"),
    ] {
        if !common::have(tool, arg) {
            return None;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let home = d.join("gnupg");
    let other_home = d.join("gnupg-other");
    let key = gpg_key(&home, "archive");
    let other = gpg_key(&other_home, "stranger");
    let armored = d.join("archive.asc");
    std::fs::write(
        &armored,
        run(gpg(&home).args(["--armor", "--export", &key])),
    )
    .unwrap();
    let binary = d.join("archive.gpg");
    std::fs::write(&binary, run(gpg(&home).args(["--export", &key]))).unwrap();

    let www = d.join("www");
    let pool = www.join("debian/pool/main");
    std::fs::create_dir_all(&pool).unwrap();
    let mut packages = String::new();
    for (name, version, extra) in CONTROLS {
        let tree = d.join("build").join(name);
        std::fs::create_dir_all(tree.join("DEBIAN")).unwrap();
        std::fs::create_dir_all(tree.join("usr/share/doc").join(name)).unwrap();
        std::fs::write(tree.join("usr/share/doc").join(name).join("README"), name).unwrap();
        let control = format!(
            "Package: {name}\nVersion: {version}\nArchitecture: amd64\n\
             Maintainer: gpubake tests <t@example.invalid>\n{extra}\
             Description: test package {name}\n"
        );
        std::fs::write(tree.join("DEBIAN/control"), &control).unwrap();
        let deb = pool.join(format!("{name}_{version}_amd64.deb"));
        run(Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "--build"])
            .arg(&tree)
            .arg(&deb));
        let bytes = std::fs::read(&deb).unwrap();
        packages.push_str(&format!(
            "{control}Filename: pool/main/{name}_{version}_amd64.deb\nSize: {}\nSHA256: {}\n\n",
            bytes.len(),
            hex::encode(sha2::Sha256::digest(&bytes))
        ));
    }
    let sign = |home: &Path, key: &str, release: &Path, out: &Path| {
        run(gpg(home)
            .args(["--yes", "--digest-algo", "SHA256", "--local-user", key])
            .arg("--output")
            .arg(out)
            .arg("--clearsign")
            .arg(release));
    };
    for suite in [
        "good", "badhash", "badsig", "unsigned", "otherkey", "expired",
    ] {
        let dist = www.join("debian/dists").join(suite);
        let index_dir = dist.join("main/binary-amd64");
        std::fs::create_dir_all(&index_dir).unwrap();
        std::fs::write(index_dir.join("Packages"), &packages).unwrap();
        run(Command::new("xz").arg("-k").arg(index_dir.join("Packages")));
        let xz = std::fs::read(index_dir.join("Packages.xz")).unwrap();
        let mut listed = hex::encode(sha2::Sha256::digest(&xz));
        if suite == "badhash" {
            // The Release vouches for other bytes than the mirror serves.
            listed = hex::encode(sha2::Sha256::digest(b"other bytes"));
        }
        let valid_until = if suite == "expired" {
            date(-1)
        } else {
            date(7)
        };
        let release = format!(
            "Origin: gpubake-test\nLabel: gpubake-test\nSuite: {suite}\nCodename: {suite}\n\
             Date: {}\nValid-Until: {valid_until}\nArchitectures: amd64\nComponents: main\n\
             SHA256:\n {listed} {} main/binary-amd64/Packages.xz\n",
            date(-2),
            xz.len()
        );
        std::fs::write(dist.join("Release"), &release).unwrap();
        let inrelease = dist.join("InRelease");
        match suite {
            "unsigned" => std::fs::write(&inrelease, &release).unwrap(),
            "otherkey" => sign(&other_home, &other, &dist.join("Release"), &inrelease),
            _ => sign(&home, &key, &dist.join("Release"), &inrelease),
        }
        if suite == "badsig" {
            let text = std::fs::read_to_string(&inrelease).unwrap();
            let flipped = text.replacen("Origin: gpubake-test", "Origin: gpubake-tesu", 1);
            assert_ne!(text, flipped);
            std::fs::write(&inrelease, flipped).unwrap();
        }
    }

    // A base with dpkg, one old tool and no sources of its own.
    let root = d.join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::create_dir_all(root.join("var/lib/dpkg")).unwrap();
    std::fs::write(
        root.join("etc/os-release"),
        "ID=debian\nVERSION_ID=\"12\"\n",
    )
    .unwrap();
    std::fs::write(
        root.join("var/lib/dpkg/status"),
        "Package: dpkg\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.21.22\n\n\
         Package: oldtool\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.5\n",
    )
    .unwrap();

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Command::new("python3")
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(port.to_string())
        .arg("--directory")
        .arg(&www)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let served = Served {
        server,
        homes: vec![home, other_home],
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "http.server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Local {
        _dir: dir,
        _served: served,
        uri: format!("http://127.0.0.1:{port}/debian"),
        armored,
        binary,
        root,
    })
}

impl Local {
    fn source(&self, suite: &str, keyring: &Path) -> Source {
        Source {
            uri: self.uri.clone(),
            suite: suite.into(),
            components: vec!["main".into()],
            keys: Keys::Files(vec![keyring.to_path_buf()]),
            at: "the test".into(),
        }
    }

    fn resolve(&self, suite: &str, list: &[&str]) -> gpubake::Result<Vec<Pin>> {
        debian::resolve(
            &Client::new(Duration::from_secs(5)).unwrap(),
            &self.root,
            &[self.source(suite, &self.armored)],
            &asks(list),
        )
    }
}

#[test]
fn a_local_archive_resolves_and_refuses_each_defect() {
    let Some(local) = local() else { return };
    let client = Client::new(Duration::from_secs(5)).unwrap();

    // The good suite, through an armored and a binary keyring.
    let pins = local.resolve("good", &["hello"]).unwrap();
    assert_eq!(
        versions(&pins),
        BTreeMap::from([
            ("hello".to_string(), "1.0".to_string()),
            ("libhello".to_string(), "1.2".to_string())
        ])
    );
    assert_eq!(pins[0].name, "libhello", "the dependency comes first");
    let deb = client
        .get(&format!("{}/{}", pins[0].base, pins[0].filename), 1 << 20)
        .unwrap();
    assert_eq!(hex::encode(sha2::Sha256::digest(&deb)), pins[0].sha256);
    let release = debian::release::fetch(&client, &local.source("good", &local.binary)).unwrap();
    assert_eq!(release.suite.as_deref(), Some("good"));

    // A .deb changed in transit (here: one byte on the mirror) is refused by the fetch the
    // build uses, naming the file, and nothing of it stays in the cache.
    let served = local._dir.path().join("www/debian").join(&pins[0].filename);
    let mut bytes = std::fs::read(&served).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    std::fs::write(&served, &bytes).unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = gpubake::wheel::cache::WheelCache::open(cache_dir.path().to_path_buf()).unwrap();
    let url = format!("{}/{}", pins[0].base, pins[0].filename);
    let e = cache
        .fetch(
            &[gpubake::wheel::cache::WheelRef {
                name: pins[0].name.clone(),
                version: pins[0].version.clone(),
                url: url.clone(),
                size: Some(pins[0].size),
                sha256: pins[0].sha256.clone(),
            }],
            &gpubake::wheel::cache::FetchOptions::default(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "{url} does not match the lock: expected sha256 {}",
            pins[0].sha256
        )),
        "{e}"
    );
    assert!(cache.file_name(&pins[0].sha256).is_none(), "{e}");

    let refused = |suite: &str, keyring: &Path| {
        let e = debian::release::fetch(&client, &local.source(suite, keyring))
            .and_then(|r| debian::packages::fetch(&client, &r, "main", "amd64"))
            .unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        e.to_string()
    };
    let at = |suite: &str| format!("{}/dists/{suite}/InRelease", local.uri);

    let e = refused("badhash", &local.armored);
    let index = format!("{}/dists/badhash/main/binary-amd64/Packages.xz", local.uri);
    assert!(e.starts_with(&format!("{index}: refused: ")), "{e}");
    assert!(e.contains(&format!("but {} lists", at("badhash"))), "{e}");

    let e = refused("badsig", &local.armored);
    assert!(
        e.starts_with(&format!("{}: refused: BAD signature", at("badsig"))),
        "{e}"
    );

    let e = refused("unsigned", &local.armored);
    assert!(
        e.starts_with(&format!(
            "{}: refused: not a clearsigned InRelease",
            at("unsigned")
        )),
        "{e}"
    );

    let e = refused("otherkey", &local.binary);
    assert!(
        e.starts_with(&format!("{}: refused: no good signature", at("otherkey"))),
        "{e}"
    );
    assert!(e.contains("signed only by keys not in the keyring"), "{e}");

    let e = refused("expired", &local.armored);
    assert!(
        e.starts_with(&format!("{}: refused: the Release expired", at("expired"))),
        "{e}"
    );

    // What the solver refuses, each naming what is wrong.
    let e = local.resolve("good", &["clash-a", "clash-b"]).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    let e = e.to_string();
    assert!(
        e.contains("clash-a 1 (to install) conflicts with clash-b 1 (to install)"),
        "{e}"
    );
    let e = local.resolve("good", &["breaker"]).unwrap_err().to_string();
    assert!(
        e.contains("breaker 1 (to install) breaks oldtool 1.5 (in the base)"),
        "{e}"
    );
    let e = local.resolve("good", &["needy"]).unwrap_err().to_string();
    assert!(
        e.contains(
            "needy 1 depends on middle\n  middle 1 depends on absent-lib (>= 3) | libhello \
             (>= 5)\n  but no package is named absent-lib and none provides it; \
             `libhello (>= 5)`: the newest libhello is 1.2"
        ),
        "{e}"
    );
    let e = local.resolve("good", &["helo"]).unwrap_err().to_string();
    assert!(e.contains("`helo`: no package of that name"), "{e}");
    assert!(e.contains("nearest names: hello"), "{e}");
}

#[test]
fn an_archive_nobody_serves_is_the_environment_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let source = Source {
        uri: format!("http://127.0.0.1:{port}/debian"),
        suite: "bookworm".into(),
        components: vec!["main".into()],
        keys: Keys::Files(vec![HOST_KEYRING.into()]),
        at: "test".into(),
    };
    if !Path::new(HOST_KEYRING).exists() {
        assert!(std::env::var_os("CI").is_none(), "CI has {HOST_KEYRING}");
        eprintln!("skipped: no {HOST_KEYRING}");
        return;
    }
    let e =
        debian::release::fetch(&Client::new(Duration::from_secs(5)).unwrap(), &source).unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");
    assert!(
        e.to_string().contains(&format!(
            "cannot reach the package archive at http://127.0.0.1:{port}/debian/dists/bookworm/InRelease"
        )),
        "{e}"
    );
    // Nothing was read: the port is still free.
    let mut buf = Vec::new();
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port))
            .map(|mut s| s.read_to_end(&mut buf))
            .is_err()
    );
}

#[test]
fn a_sample_of_the_archive_resolves_as_apt_resolves_it() {
    let Some(live) = live() else { return };
    let mut names: Vec<&str> = live
        .available
        .iter()
        .map(|p| p.name.as_str())
        .filter(|n| !live.installed(n))
        .collect();
    names.sort();
    names.dedup();
    // Every 1500th name: about 40 packages from all over the archive, the same ones each run
    // of one archive state.
    let mut agreed = 0;
    let mut apt_refused = 0;
    let mut differ = Vec::new();
    for name in names.iter().step_by(STEP) {
        let ours = live.ours(&[name]);
        match (live.apt(&[name]), ours) {
            (Ok(apt), Ok(pins)) if versions(&pins) == apt => agreed += 1,
            (Err(_), Err(_)) => apt_refused += 1,
            (apt, ours) => differ.push(format!(
                "{name}: apt {:?}\n  gpubake {:?}",
                apt.map(|a| a.len()),
                ours.map(|p| versions(&p))
            )),
        }
    }
    eprintln!("sample: {agreed} agree with apt, {apt_refused} refused by both");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}
