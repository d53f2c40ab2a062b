//! Signing keys against the tools that share their formats: keys cosign 2.5 and skopeo 1.18
//! generated (tests/fixtures/sign/, see its README.md) are read and sign, a signature cosign
//! made verifies, openssl verifies what gpubake signs and computes the same key hint, and
//! `gpubake key` writes a pair with the modes and names the tools use.
//!
//! With GPUBAKE_TRIXIE_ROOT naming a Debian trixie root with cosign and skopeo
//! (scripts/sign-interop), the last test also has cosign and skopeo sign and verify with a
//! key `gpubake key generate` wrote, and skopeo sign an image pushed to a local registry.

mod common;
#[path = "common/local_registry.rs"]
mod local_registry;
use local_registry::local_registry;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::{assert_exit, mode, stderr, stdout};
use gpubake::sign::keys::{PrivateKey, PublicKey, passphrase};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The bytes of a file of base64, as cosign writes signatures.
fn b64_file(path: &Path) -> Vec<u8> {
    STANDARD
        .decode(std::fs::read_to_string(path).unwrap().trim())
        .unwrap()
}

fn fixture(name: &str) -> PathBuf {
    common::root().join("tests/fixtures/sign").join(name)
}

/// The PEM label of an encrypted key and the scrypt N of its JSON document.
fn label_and_n(path: &Path) -> (String, u64) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let label = lines.next().unwrap();
    let label = label
        .strip_prefix("-----BEGIN ")
        .unwrap()
        .strip_suffix("-----")
        .unwrap();
    let b64: String = lines.take_while(|l| !l.starts_with("-----END")).collect();
    let doc: serde_json::Value = serde_json::from_slice(&STANDARD.decode(b64).unwrap()).unwrap();
    (
        label.to_string(),
        doc["kdf"]["params"]["N"].as_u64().unwrap(),
    )
}

/// The fixture keys: private key, public key, passphrase file, and the form the tool wrote.
const MADE_BY_TOOLS: &[(&str, &str, &str, &str, u64)] = &[
    (
        "cosign-2.5.key",
        "cosign-2.5.pub",
        "cosign-2.5.pass",
        "ENCRYPTED SIGSTORE PRIVATE KEY",
        65536,
    ),
    (
        "skopeo-1.18.private",
        "skopeo-1.18.pub",
        "skopeo-1.18.pass",
        "ENCRYPTED COSIGN PRIVATE KEY",
        65536,
    ),
    (
        "skopeo-1.18-empty.private",
        "skopeo-1.18-empty.pub",
        "",
        "ENCRYPTED COSIGN PRIVATE KEY",
        65536,
    ),
];

#[test]
fn keys_cosign_and_skopeo_generated_are_read_with_their_passphrases_and_sign() {
    for &(key, public, pass, label, n) in MADE_BY_TOOLS {
        // The forms section 5 of the formats notes records for these versions.
        assert_eq!(label_and_n(&fixture(key)), (label.to_string(), n), "{key}");
        let pass = (!pass.is_empty()).then(|| fixture(pass));
        let phrase = passphrase(pass.as_deref()).unwrap();
        let private = PrivateKey::read(&fixture(key), &phrase).unwrap();
        let public = PublicKey::read(&fixture(public)).unwrap();
        assert_eq!(private.public(), public, "{key}");
        let sig = private.sign(b"payload");
        public.verify(b"payload", &sig).unwrap();
        assert!(public.verify(b"payloae", &sig).is_err());
        // The error names the file and says what is wrong.
        let err = PrivateKey::read(&fixture(key), b"not it")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("{}: wrong passphrase", fixture(key).display())),
            "{err}"
        );
    }
    // A public key given where the private key belongs, and the other way round.
    let err = PrivateKey::read(&fixture("cosign-2.5.pub"), b"")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cosign-2.5.pub: a public key, not a private key"),
        "{err}"
    );
    let err = PublicKey::read(&fixture("cosign-2.5.key"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cosign-2.5.key: a private key, not a public key"),
        "{err}"
    );
    let err = PublicKey::read(&fixture("message.txt"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("message.txt: not PEM"), "{err}");
}

#[test]
fn signatures_cosign_and_skopeo_made_verify_and_a_flipped_byte_does_not() {
    let cosign = PublicKey::read(&fixture("cosign-2.5.pub")).unwrap();
    let skopeo = PublicKey::read(&fixture("skopeo-1.18.pub")).unwrap();
    let read_sig = |name: &str| b64_file(&fixture(name));
    // `cosign sign-blob` over a file; skopeo's over the simple-signing payload it pushed.
    for (key, message, sig) in [
        (&cosign, "message.txt", "cosign-2.5.message.sig"),
        (
            &skopeo,
            "skopeo-1.18.simplesigning.json",
            "skopeo-1.18.simplesigning.sig",
        ),
    ] {
        let message = std::fs::read(fixture(message)).unwrap();
        let sig = read_sig(sig);
        key.verify(&message, &sig).unwrap();
        let mut changed = message.clone();
        changed[3] ^= 0x20;
        assert!(key.verify(&changed, &sig).is_err());
        let mut bad = sig.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(key.verify(&message, &bad).is_err());
    }
    assert!(
        skopeo
            .verify(
                b"gpubake fixture message\n",
                &read_sig("cosign-2.5.message.sig")
            )
            .is_err()
    );
}

fn openssl(args: &[&str]) -> Output {
    Command::new("openssl").args(args).output().unwrap()
}

/// openssl's verdict on `sig` (DER) over `message` with the public key at `public`.
fn openssl_verifies(dir: &Path, public: &Path, message: &[u8], sig: &[u8]) -> bool {
    let (m, s) = (dir.join("message"), dir.join("sig.der"));
    std::fs::write(&m, message).unwrap();
    std::fs::write(&s, sig).unwrap();
    let out = openssl(&[
        "dgst",
        "-sha256",
        "-verify",
        &public.display().to_string(),
        "-signature",
        &s.display().to_string(),
        &m.display().to_string(),
    ]);
    let verified = out.status.success() && stdout(&out).contains("Verified OK");
    assert!(
        verified || stdout(&out).contains("Verification failure"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    verified
}

/// The hint as the formats notes derive it with openssl.
fn openssl_hint(public: &Path) -> String {
    let out = Command::new("sh")
        .args([
            "-c",
            "openssl pkey -pubin -in \"$1\" -outform DER | openssl dgst -sha256 -binary | base64",
            "sh",
        ])
        .arg(public)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

#[test]
fn openssl_verifies_what_gpubake_signs_and_computes_the_same_hint() {
    if !common::have("openssl", "version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let generated = PrivateKey::generate();
    let generated_pub = dir.path().join("generated.pub");
    std::fs::write(&generated_pub, generated.public().to_pem()).unwrap();
    let mut keys = vec![(generated, generated_pub)];
    for &(key, public, pass, ..) in MADE_BY_TOOLS {
        let pass = (!pass.is_empty()).then(|| fixture(pass));
        let private =
            PrivateKey::read(&fixture(key), &passphrase(pass.as_deref()).unwrap()).unwrap();
        keys.push((private, fixture(public)));
    }
    for (key, public) in &keys {
        let message = b"{\"critical\":{}}";
        let sig = key.sign(message);
        assert!(
            openssl_verifies(dir.path(), public, message, &sig),
            "{}",
            public.display()
        );
        assert!(!openssl_verifies(
            dir.path(),
            public,
            b"{\"critical\":{ }}",
            &sig
        ));
        assert_eq!(
            key.public().hint(),
            openssl_hint(public),
            "{}",
            public.display()
        );
    }
    // The hint cosign 2.5 wrote in a bundle for its fixture key is the same derivation.
    assert_eq!(
        PublicKey::read(&fixture("cosign-2.5.pub")).unwrap().hint(),
        openssl_hint(&fixture("cosign-2.5.pub"))
    );
}

#[test]
fn keys_openssl_writes_are_read_in_each_plain_form_and_other_curves_named() {
    if !common::have("openssl", "version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let ok = |out: Output| assert!(out.status.success(), "{}", stderr(&out));
    // PKCS#8 (`PRIVATE KEY`), and SEC1 after the `EC PARAMETERS` block ecparam writes first.
    ok(openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        &p("pkcs8.pem"),
    ]));
    ok(openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-out",
        &p("sec1.pem"),
    ]));
    for name in ["pkcs8.pem", "sec1.pem"] {
        ok(openssl(&[
            "pkey",
            "-in",
            &p(name),
            "-pubout",
            "-out",
            &p(&format!("{name}.pub")),
        ]));
        let key = PrivateKey::read(Path::new(&p(name)), b"ignored").unwrap();
        let public = PublicKey::read(Path::new(&p(&format!("{name}.pub")))).unwrap();
        assert_eq!(key.public(), public, "{name}");
        // openssl's own signature verifies here too.
        std::fs::write(p("m"), b"message").unwrap();
        ok(openssl(&[
            "dgst",
            "-sha256",
            "-sign",
            &p(name),
            "-out",
            &p("m.sig"),
            &p("m"),
        ]));
        public
            .verify(b"message", &std::fs::read(p("m.sig")).unwrap())
            .unwrap();
    }
    let text = std::fs::read_to_string(p("sec1.pem")).unwrap();
    assert!(
        text.starts_with("-----BEGIN EC PARAMETERS-----") && text.contains("EC PRIVATE KEY"),
        "{text}"
    );
    // Keys of other kinds are refused naming what they are, in both private forms.
    ok(openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-384",
        "-out",
        &p("p384.pem"),
    ]));
    ok(openssl(&[
        "ec",
        "-in",
        &p("p384.pem"),
        "-out",
        &p("p384.sec1.pem"),
    ]));
    ok(openssl(&[
        "ec",
        "-in",
        &p("p384.pem"),
        "-pubout",
        "-out",
        &p("p384.pub"),
    ]));
    ok(openssl(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-out",
        &p("ed.pem"),
    ]));
    for (name, what) in [
        ("p384.pem", "an EC key on P-384, not ECDSA P-256"),
        ("p384.sec1.pem", "an EC key on P-384, not ECDSA P-256"),
        ("ed.pem", "an Ed25519 key, not ECDSA P-256"),
    ] {
        let err = PrivateKey::read(Path::new(&p(name)), b"")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(&format!("{}: {what}", p(name))), "{err}");
    }
    let err = PublicKey::read(Path::new(&p("p384.pub")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("an EC key on P-384, not ECDSA P-256"), "{err}");
}

fn gpubake_env(dir: &Path, args: &[&str], env: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpubake"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("GPUBAKE_KEY_PASSPHRASE");
    if let Some(value) = env {
        cmd.env("GPUBAKE_KEY_PASSPHRASE", value);
    }
    cmd.output().unwrap()
}

#[test]
fn key_generate_writes_an_encrypted_key_0600_and_its_public_key_0644() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pass"), "s3cret\nignored second line\n").unwrap();
    let prefix = dir.path().join("release").display().to_string();
    // Under umask 000 as under any other: the key's mode does not come from the umask.
    let out = common::gpubake_umask(
        "000",
        &[
            "key",
            "generate",
            "--output-prefix",
            &prefix,
            "--passphrase-file",
            &format!("{}/pass", dir.path().display()),
        ],
    );
    assert_exit(&out, 0);
    let (key, public) = (
        dir.path().join("release.key"),
        dir.path().join("release.pub"),
    );
    assert_eq!((mode(&key), mode(&public)), (0o600, 0o644));
    assert_eq!(
        label_and_n(&key),
        ("ENCRYPTED COSIGN PRIVATE KEY".to_string(), 32768)
    );
    let private = PrivateKey::read(&key, b"s3cret").unwrap();
    let read = PublicKey::read(&public).unwrap();
    assert_eq!(private.public(), read);
    assert!(
        stdout(&out).contains(&format!("hint {}", read.hint())),
        "{}",
        stdout(&out)
    );
    assert!(
        !stderr(&out).contains("empty passphrase"),
        "{}",
        stderr(&out)
    );
    // Nothing else is left beside them: no temporary file.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["pass", "release.key", "release.pub"]);
    // `key public` prints exactly the .pub, whether given the private or the public key.
    let pass = dir.path().join("pass").display().to_string();
    let out = gpubake_env(
        dir.path(),
        &["key", "public", "release.key", "--passphrase-file", &pass],
        None,
    );
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), std::fs::read_to_string(&public).unwrap());
    assert!(stderr(&out).contains(&read.hint()));
    let out = gpubake_env(
        dir.path(),
        &["key", "public", "release.pub", "--json"],
        None,
    );
    assert_exit(&out, 0);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["hint"], read.hint());
    let out = gpubake_env(dir.path(), &["key", "public", "release.key"], None);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("release.key: wrong passphrase"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn key_generate_takes_the_passphrase_file_then_the_environment_then_empty() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pass"), "from the file").unwrap();
    let run = |prefix: &str, file: bool, env: Option<&str>| {
        let mut args = vec!["key", "generate", "--output-prefix", prefix, "--json"];
        if file {
            args.extend(["--passphrase-file", "pass"]);
        }
        let out = gpubake_env(dir.path(), &args, env);
        assert_exit(&out, 0);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["private_key"], format!("{prefix}.key"));
        (dir.path().join(format!("{prefix}.key")), stderr(&out))
    };
    let (key, _) = run("file", true, Some("from the env"));
    assert!(PrivateKey::read(&key, b"from the file").is_ok());
    let (key, _) = run("env", false, Some("from the env"));
    assert!(PrivateKey::read(&key, b"from the env").is_ok());
    let (key, note) = run("empty", false, None);
    assert!(PrivateKey::read(&key, b"").is_ok());
    assert!(
        note.contains("empty.key is encrypted with an empty passphrase"),
        "{note}"
    );
    // A prefix with dots keeps them; a missing directory or passphrase file is named.
    run("v1.2", false, None);
    assert!(dir.path().join("v1.2.key").exists() && dir.path().join("v1.2.pub").exists());
    let out = gpubake_env(
        dir.path(),
        &["key", "generate", "--output-prefix", "nowhere/k"],
        None,
    );
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("nowhere"), "{}", stderr(&out));
    let out = gpubake_env(
        dir.path(),
        &[
            "key",
            "generate",
            "--output-prefix",
            "k",
            "--passphrase-file",
            "absent",
        ],
        None,
    );
    assert_exit(&out, 2);
    assert!(stderr(&out).contains("absent"), "{}", stderr(&out));
    assert!(!dir.path().join("k.key").exists());
}

#[test]
fn key_generate_overwrites_nothing_and_writes_neither_file_when_one_exists() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.pub"), "old public").unwrap();
    std::fs::write(d.join("b.key"), "old private").unwrap();
    std::os::unix::fs::symlink("elsewhere/target", d.join("c.key")).unwrap();
    for (prefix, existing) in [("a", "a.pub"), ("b", "b.key"), ("c", "c.key")] {
        let out = gpubake_env(d, &["key", "generate", "--output-prefix", prefix], None);
        assert_exit(&out, 2);
        assert!(
            stderr(&out).contains(&format!("{existing}: exists")),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(
        std::fs::read_to_string(d.join("a.pub")).unwrap(),
        "old public"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("b.key")).unwrap(),
        "old private"
    );
    assert!(!d.join("a.key").exists() && !d.join("b.pub").exists() && !d.join("c.pub").exists());
    assert!(!d.join("elsewhere").exists());
}

// ----------------------------------------------------------------------------------------
// cosign and skopeo themselves, in a Debian trixie root (scripts/sign-interop).

/// Runs `script` with sh in `root`'s chroot, in `dir` (a path inside the root).
fn chroot(root: &Path, dir: &str, script: &str, env: &[(&str, &str)]) -> Output {
    let out = Command::new("chroot")
        .arg(root)
        .args(["sh", "-c", &format!("cd '{dir}' && {script}")])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    eprintln!("$ {script}\n{}{}", stdout(&out), stderr(&out));
    out
}

#[test]
fn cosign_and_skopeo_sign_and_verify_with_a_key_gpubake_generated() {
    let Some(root) = std::env::var_os("GPUBAKE_TRIXIE_ROOT").map(PathBuf::from) else {
        eprintln!(
            "skipped: GPUBAKE_TRIXIE_ROOT names no Debian trixie root with cosign and skopeo"
        );
        return;
    };
    let work = tempfile::tempdir_in(root.join("tmp")).unwrap();
    let inside = format!(
        "/tmp/{}",
        work.path().file_name().unwrap().to_string_lossy()
    );
    let w = work.path();
    std::fs::write(w.join("pass"), "interop pass\n").unwrap();
    assert_exit(
        &gpubake_env(
            w,
            &[
                "key",
                "generate",
                "--output-prefix",
                "gpubake",
                "--passphrase-file",
                "pass",
            ],
            None,
        ),
        0,
    );
    let key = PrivateKey::read(&w.join("gpubake.key"), b"interop pass").unwrap();
    let public = key.public();
    std::fs::write(w.join("message.txt"), "signed by gpubake\n").unwrap();
    let cosign_env = [("COSIGN_PASSWORD", "interop pass")];
    // cosign reads the key gpubake wrote and signs; gpubake verifies that signature.
    let out = chroot(
        &root,
        &inside,
        "cosign sign-blob --key gpubake.key --tlog-upload=false --output-signature cosign.sig message.txt",
        &cosign_env,
    );
    assert_exit(&out, 0);
    let sig = b64_file(&w.join("cosign.sig"));
    public.verify(b"signed by gpubake\n", &sig).unwrap();
    // cosign verifies, offline, what gpubake signs, and refuses it for another message.
    std::fs::write(
        w.join("gpubake.sig"),
        STANDARD.encode(key.sign(b"signed by gpubake\n")),
    )
    .unwrap();
    let verify = "cosign verify-blob --key gpubake.pub --signature gpubake.sig --insecure-ignore-tlog --offline";
    let out = chroot(&root, &inside, &format!("{verify} message.txt"), &[]);
    assert_exit(&out, 0);
    assert!(stderr(&out).contains("Verified OK"), "{}", stderr(&out));
    std::fs::write(w.join("other.txt"), "signed by gpubake?\n").unwrap();
    assert_exit(
        &chroot(&root, &inside, &format!("{verify} other.txt"), &[]),
        1,
    );
    // A key generated without a passphrase is one cosign reads with an empty one.
    let out = gpubake_env(w, &["key", "generate", "--output-prefix", "empty"], None);
    assert_exit(&out, 0);
    let out = chroot(
        &root,
        &inside,
        "cosign sign-blob --key empty.key --tlog-upload=false --output-signature empty.sig message.txt",
        &[("COSIGN_PASSWORD", "")],
    );
    assert_exit(&out, 0);
    let sig = b64_file(&w.join("empty.sig"));
    let empty = PublicKey::read(&w.join("empty.pub")).unwrap();
    empty.verify(b"signed by gpubake\n", &sig).unwrap();
    if common::have("docker-registry", "--version") {
        skopeo_signs_an_image_with_the_key(&root, w, &inside, &public);
    }
}

/// An OCI layout of one small layer at `dir`, tagged v1.
fn oci_layout(dir: &Path) {
    use sha2::Digest as _;
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let hex = hex::encode(sha2::Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        (format!("sha256:{hex}"), bytes.len())
    };
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_size(3);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "hello.txt", &b"hi\n"[..])
        .unwrap();
    let (layer, layer_size) = put(&tar.into_inner().unwrap());
    let config = serde_json::json!({"architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer]}});
    let (config, config_size) = put(&serde_json::to_vec(&config).unwrap());
    let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": layer_size}]});
    let (manifest, manifest_size) = put(&serde_json::to_vec(&manifest).unwrap());
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": manifest, "size": manifest_size, "annotations": {"org.opencontainers.image.ref.name": "v1"}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

fn curl(url: &str) -> Vec<u8> {
    let out = Command::new("curl")
        .args([
            "-fsS",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
            url,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {url}: {}", stderr(&out));
    out.stdout
}

/// skopeo signs an image it pushes with the key gpubake wrote; gpubake verifies the
/// signature it attached, skopeo accepts the image under a policy of the .pub and refuses it
/// under another key's, and cosign verifies it.
fn skopeo_signs_an_image_with_the_key(root: &Path, w: &Path, inside: &str, public: &PublicKey) {
    let registry = local_registry(w);
    let addr = &registry.1;
    oci_layout(&w.join("oci"));
    local_registry::sigstore_attachments(w, addr);
    let image = format!("{addr}/interop/app:v1");
    let skopeo = "skopeo --registries.d registries.d";
    let out = chroot(
        root,
        inside,
        &format!(
            "{skopeo} --policy accept.json copy --dest-tls-verify=false --sign-by-sigstore-private-key gpubake.key --sign-passphrase-file pass oci:oci:v1 docker://{image}"
        ),
        &[],
    );
    assert_exit(&out, 0);
    // The signature skopeo attached, found as podman and skopeo find it.
    let head = Command::new("curl")
        .args([
            "-fsSI",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
            &format!("http://{addr}/v2/interop/app/manifests/v1"),
        ])
        .output()
        .unwrap();
    let digest = stdout(&head)
        .lines()
        .find_map(|l| {
            l.strip_prefix("Docker-Content-Digest: ")
                .or_else(|| l.strip_prefix("docker-content-digest: "))
        })
        .unwrap()
        .trim()
        .to_string();
    let sig_tag = format!("{}.sig", digest.replacen(':', "-", 1));
    let manifest: serde_json::Value = serde_json::from_slice(&curl(&format!(
        "http://{addr}/v2/interop/app/manifests/{sig_tag}"
    )))
    .unwrap();
    let layer = &manifest["layers"][0];
    let payload = curl(&format!(
        "http://{addr}/v2/interop/app/blobs/{}",
        layer["digest"].as_str().unwrap()
    ));
    let sig = STANDARD
        .decode(
            layer["annotations"]["dev.cosignproject.cosign/signature"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    public.verify(&payload, &sig).unwrap();
    let payload: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(
        payload["critical"]["image"]["docker-manifest-digest"],
        digest.as_str()
    );
    // skopeo pulls it under a policy that asks for a signature by the key, and only that key.
    let policy = |key: &str| {
        format!(
            r#"{{"default":[{{"type":"reject"}}],"transports":{{"docker":{{"{addr}":[{{"type":"sigstoreSigned","keyPath":"{inside}/{key}","signedIdentity":{{"type":"matchRepository"}}}}]}},"dir":{{"":[{{"type":"insecureAcceptAnything"}}]}}}}}}"#
        )
    };
    std::fs::write(w.join("policy.json"), policy("gpubake.pub")).unwrap();
    std::fs::write(
        w.join("other.pub"),
        PrivateKey::generate().public().to_pem(),
    )
    .unwrap();
    std::fs::write(w.join("policy-other.json"), policy("other.pub")).unwrap();
    let pull = |policy: &str, to: &str| {
        chroot(
            root,
            inside,
            &format!(
                "{skopeo} --policy {policy} copy --src-tls-verify=false docker://{image} dir:{to}"
            ),
            &[],
        )
    };
    assert_exit(&pull("policy.json", "pulled"), 0);
    let out = pull("policy-other.json", "refused");
    assert_exit(&out, 1);
    assert!(
        stderr(&out).contains("invalid signature when validating ASN.1 encoded signature"),
        "{}",
        stderr(&out)
    );
    let out = chroot(
        root,
        inside,
        &format!(
            "cosign verify --key gpubake.pub --insecure-ignore-tlog=true --allow-http-registry {image}"
        ),
        &[],
    );
    assert_exit(&out, 0);
}

/// A key that would sign nothing (a layout destination, no --provenance) is refused before
/// the build writes anything; with --provenance the same build signs and writes it.
#[test]
fn build_with_a_key_but_nothing_to_sign_is_refused_before_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    assert_exit(
        &gpubake_env(w, &["key", "generate", "--output-prefix", "k"], Some("")),
        0,
    );
    let recipe = common::write(
        w,
        "recipe.yaml",
        &common::recipe("pytorch: '2.9'\npresets: [base]\n"),
    );
    let from = common::from_base();
    let out_dir = w.join("out");
    let to = format!("oci:{}:v1", out_dir.display());
    let key = w.join("k.key").display().to_string();
    let out = gpubake_env(
        w,
        &common::build_args(&recipe, &from, &to, &["--key", &key]),
        Some(""),
    );
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("is not a registry: add --provenance FILE"),
        "{}",
        stderr(&out)
    );
    assert!(!out_dir.exists(), "nothing was built");
    let provenance = w.join("provenance.json");
    let with_file = [
        "--key",
        key.as_str(),
        "--provenance",
        provenance.to_str().unwrap(),
    ];
    let out = gpubake_env(
        w,
        &common::build_args(&recipe, &from, &to, &with_file),
        Some(""),
    );
    assert_exit(&out, 0);
    let public = PublicKey::read(&w.join("k.pub")).unwrap();
    let bundle =
        gpubake::sign::bundle::Bundle::from_slice(&std::fs::read(&provenance).unwrap()).unwrap();
    assert!(bundle.verify(&public).is_ok());
}

/// `inspect` labels the verdict a referrer's listing states as unchecked, whoever pushed it;
/// `inspect --key` checks each bundle's signature and shows only what the key signed about
/// this image as checked (issue 40, finding 7).
#[test]
fn inspect_labels_listed_verdicts_unchecked_and_checks_them_with_the_key() {
    use gpubake::certify::CERTIFICATE_PREDICATE;
    use gpubake::sign::bundle::{self, Bundle};
    use gpubake::sign::statement::{Descriptor, Statement};
    if !common::tools() || !common::have("docker-registry", "--version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    let registry = local_registry(w);
    let key = PrivateKey::generate();
    std::fs::write(w.join("k.key"), key.to_encrypted_pem(b"")).unwrap();
    std::fs::write(w.join("k.pub"), key.public().to_pem()).unwrap();
    let (key_path, public) = (
        w.join("k.key").display().to_string(),
        w.join("k.pub").display().to_string(),
    );
    let recipe = common::write(w, "r.yaml", &common::recipe("pytorch: '2.9'\n"));
    let target = format!("docker://{}/app:v1", registry.1);
    let from = common::from_base();
    let out = gpubake_env(
        w,
        &common::build_args(&recipe, &from, &target, &["--json"]),
        None,
    );
    assert_exit(&out, 0);
    let built: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let digest = built["manifest"].as_str().unwrap().to_string();
    // The real certificate, signed with the key.
    let certify = [
        "certify", &target, "--gpus", "none", "--attach", "--key", &key_path,
    ];
    assert_exit(&gpubake_env(w, &certify, None), 0);
    // A forged one: another key signs a probe's pass, and the listing says the same.
    let statement = Statement::new(
        vec![Descriptor::of("app", &digest)],
        CERTIFICATE_PREDICATE,
        serde_json::json!({"verdict": "certified", "scope": "probe gpus=all"}),
    );
    let forged_bundle = Bundle::sign(&statement, &PrivateKey::generate());
    let mut annotations = bundle::annotations(CERTIFICATE_PREDICATE, "2026-12-04T00:00:00Z");
    annotations.insert("io.gpubake.verdict".into(), "certified".into());
    annotations.insert("io.gpubake.scope".into(), "probe gpus=all".into());
    let remote = gpubake::image::registry::Remote {
        reference: target.trim_start_matches("docker://").to_string(),
        access: Default::default(),
    };
    let forged = gpubake::image::referrers::attach(
        &remote,
        &digest.parse().unwrap(),
        bundle::MEDIA_TYPE,
        &serde_json::to_vec(&forged_bundle).unwrap(),
        annotations,
    )
    .unwrap()
    .to_string();
    let line_of = |text: &str, digest: &str| -> String {
        text.lines()
            .find(|l| l.contains(digest))
            .unwrap_or_else(|| panic!("{digest}: {text}"))
            .to_string()
    };

    let out = gpubake_env(w, &["inspect", &target], None);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(
        line_of(&text, &forged).ends_with(
            "certified (probe gpus=all) [unchecked: an unsigned annotation; inspect --key \
             PUB.pem checks the signature]"
        ),
        "{text}"
    );

    let out = gpubake_env(w, &["inspect", &target, "--key", &public], None);
    assert_exit(&out, 0);
    let text = stdout(&out);
    assert!(
        line_of(&text, &forged).contains("[not believed: it is signed with another key"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.ends_with("  certified (static gpus=none) [signed with the key]")),
        "{text}"
    );
    let out = gpubake_env(w, &["inspect", &target, "--key", &public, "--json"], None);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let verified: Vec<bool> = report["signatures"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"))
        .iter()
        .map(|s| s["verified"].as_bool().unwrap())
        .collect();
    assert_eq!(verified.iter().filter(|v| **v).count(), 1, "{report}");
    assert_eq!(verified.len(), 2, "{report}");
}
