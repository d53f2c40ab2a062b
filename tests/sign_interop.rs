//! gpubake's image signatures and Sigstore bundles against the tools that read them elsewhere:
//! podman 5.4, skopeo 1.18 and cosign 2.5 from Debian trixie, run in a trixie root through
//! chroot (Debian bookworm's podman and skopeo have sigstore patched out), and a
//! `docker-registry` on a free loopback port speaking plain HTTP.
//!
//! * gpubake signs; podman pulls the image under a policy that requires a sigstore signature
//!   by gpubake's key, refuses the same image unsigned, and refuses it under another key.
//! * skopeo signs with a key gpubake generated; `gpubake verify` accepts it with that key only.
//! * cosign verifies gpubake's simple signature, its SLSA provenance bundle and its
//!   certificate bundle, offline, with the key only.
//!
//! Runs only when GPUBAKE_TRIXIE_ROOT names such a root (scripts/sign-interop makes one).

mod common;
#[path = "common/local_registry.rs"]
mod local_registry;
use local_registry::local_registry;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use common::{assert_exit, from_base, gpubake_in, stderr, stdout, write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Prints a command line and what it wrote, for the record scripts/sign-interop keeps.
fn show(what: &str, out: &Output) {
    eprintln!(
        "$ {what}\n{}{}[exit {}]\n",
        stdout(out),
        stderr(out),
        out.status.code().map_or("signal".into(), |c| c.to_string())
    );
}

/// Runs `script` with sh in `root`'s chroot, in `dir` (a path inside the root).
fn chroot(root: &Path, dir: &str, script: &str) -> Output {
    let out = Command::new("chroot")
        .arg(root)
        .args(["sh", "-c", &format!("cd '{dir}' && {script}")])
        .output()
        .unwrap();
    show(script, &out);
    out
}

/// Runs podman in `root`, in `dir`, with `args`. podman applies layers only where the root is
/// a mount point, so this runs in a mount namespace of its own in which the root is bound onto
/// itself, with /proc, /sys and /dev; everything mounted goes when the namespace does. `HOME`
/// is `dir/home`, where podman finds the registries.d that turns sigstore attachments on.
/// `store` names the image store, one for each pull, so that no pull finds an image an
/// earlier one stored.
fn podman(root: &Path, dir: &str, store: &str, args: &str) -> Output {
    let script = format!(
        "cd '{dir}' && HOME='{dir}/home' PODMAN_IGNORE_CGROUPSV1_WARNING=1 podman --storage-driver vfs \
         --root '{dir}/store-{store}' --runroot '{dir}/run-{store}' --cgroup-manager cgroupfs \
         --events-backend file {args}"
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount --bind \"$1\" \"$1\" && mount -t proc proc \"$1/proc\" && \
             mount --rbind /sys \"$1/sys\" && mount --rbind /dev \"$1/dev\" && \
             exec chroot \"$1\" sh -c \"$2\"",
        )
        .arg("sh")
        .arg(root)
        .arg(&script)
        .output()
        .unwrap();
    show(&format!("podman {args}"), &out);
    out
}

/// Runs gpubake in `dir` and records it like the tools.
fn gpubake(dir: &Path, args: &[&str]) -> Output {
    let out = gpubake_in(dir, args);
    show(&format!("gpubake {}", args.join(" ")), &out);
    out
}

/// The first line of `text` that contains `needle`, to quote a tool's verdict.
fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

/// Asserts that `out` exited `code` and that its stdout or stderr says `needle`; prints the
/// line that says it.
fn says(tool: &str, out: &Output, code: i32, needle: &str) {
    let text = format!("{}{}", stdout(out), stderr(out));
    assert_eq!(out.status.code(), Some(code), "{tool}:\n{text}");
    eprintln!(
        "verdict: {tool}: exit {code}: {}\n",
        line_with(&text, needle)
    );
}

/// The manifest digest a build reported with `--json`.
fn manifest_of(out: &Output) -> String {
    assert_exit(out, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout(out))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(out), stderr(out)));
    v["manifest"].as_str().unwrap().to_string()
}

/// The in-toto statements in what `cosign verify-attestation` printed: one DSSE envelope
/// as JSON on each line.
fn statements(out: &Output) -> Vec<serde_json::Value> {
    stdout(out)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let envelope: serde_json::Value = serde_json::from_str(l).unwrap();
            let payload = STANDARD
                .decode(envelope["payload"].as_str().unwrap())
                .unwrap();
            serde_json::from_slice(&payload).unwrap()
        })
        .collect()
}

#[test]
fn podman_skopeo_and_cosign_accept_what_gpubake_signs_and_gpubake_what_skopeo_signs() {
    let Some(root) = std::env::var_os("GPUBAKE_TRIXIE_ROOT").map(PathBuf::from) else {
        eprintln!(
            "skipped: GPUBAKE_TRIXIE_ROOT names no Debian trixie root with podman, skopeo and cosign"
        );
        return;
    };
    if !common::have("docker-registry", "--version") || !common::tools() {
        return;
    }
    for tool in ["podman", "skopeo", "cosign"] {
        assert!(
            root.join("usr/bin").join(tool).exists(),
            "{} has no {tool}",
            root.display()
        );
    }
    let work = tempfile::tempdir_in(root.join("tmp")).unwrap();
    let inside = format!(
        "/tmp/{}",
        work.path().file_name().unwrap().to_string_lossy()
    );
    let w = work.path();
    let registry = local_registry(w);
    let addr = registry.1.clone();

    // Two keys gpubake generates: the one that signs, and a stranger.
    std::fs::write(w.join("pass"), "interop pass\n").unwrap();
    for prefix in ["gpubake", "other"] {
        let out = gpubake(
            w,
            &[
                "key",
                "generate",
                "--output-prefix",
                prefix,
                "--passphrase-file",
                "pass",
            ],
        );
        assert_exit(&out, 0);
    }
    let recipe = write(
        w,
        "recipe.yaml",
        "name: interop\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\n",
    );
    let from = from_base();

    // gpubake builds, pushes and signs; the same content goes, unsigned, to another repository.
    let signed = format!("{addr}/signed/app:v1");
    let unsigned = format!("{addr}/unsigned/app:v2");
    let to = format!("docker://{signed}");
    let out = gpubake(
        w,
        &common::build_args(
            &recipe,
            &from,
            &to,
            &[
                "--json",
                "--key",
                "gpubake.key",
                "--passphrase-file",
                "pass",
                "--provenance",
                "provenance.json",
            ],
        ),
    );
    let digest = manifest_of(&out);
    let to = format!("docker://{unsigned}");
    let out = gpubake(w, &common::build_args(&recipe, &from, &to, &["--json"]));
    assert_eq!(
        manifest_of(&out),
        digest,
        "the same content, the same manifest"
    );

    // 1. podman pulls under a policy of gpubake's key, with sigstore attachments on. The
    // default signedIdentity (matchRepoDigestOrExact) asks the signature to name the
    // repository and tag pulled.
    let registries_d = w.join("home/.config/containers/registries.d");
    std::fs::create_dir_all(&registries_d).unwrap();
    std::fs::write(
        registries_d.join("local.yaml"),
        format!("docker:\n  {addr}:\n    use-sigstore-attachments: true\n"),
    )
    .unwrap();
    let policy = |key: &str| {
        format!(
            r#"{{"default":[{{"type":"reject"}}],"transports":{{"docker":{{"{addr}":[{{"type":"sigstoreSigned","keyPath":"{inside}/{key}"}}]}},"dir":{{"":[{{"type":"insecureAcceptAnything"}}]}}}}}}"#
        )
    };
    std::fs::write(w.join("policy.json"), policy("gpubake.pub")).unwrap();
    std::fs::write(w.join("policy-other.json"), policy("other.pub")).unwrap();
    let pull = |store: &str, policy: &str, image: &str| {
        podman(
            &root,
            &inside,
            store,
            &format!("pull --signature-policy {policy} --tls-verify=false {image}"),
        )
    };
    let out = pull("signed", "policy.json", &signed);
    says("podman pull, signed", &out, 0, "Storing signatures");
    let id = config_of(w, &digest);
    assert_eq!(
        stdout(&out).trim(),
        id.trim_start_matches("sha256:"),
        "podman prints the ID of the image it stored"
    );
    let out = pull("unsigned", "policy.json", &unsigned);
    says(
        "podman pull, unsigned",
        &out,
        125,
        "Source image rejected: A signature was required, but no signature exists",
    );
    let out = pull("other", "policy-other.json", &signed);
    says(
        "podman pull, another key",
        &out,
        125,
        "Source image rejected: cryptographic signature verification failed: invalid signature when validating ASN.1 encoded signature",
    );

    // 2. skopeo signs, with gpubake's key, an image gpubake built into an OCI layout;
    // gpubake verifies that signature with the key, and refuses it with another.
    let layout = format!("oci:{}:v1", w.join("layout").display());
    let out = gpubake(w, &common::build_args(&recipe, &from, &layout, &["--json"]));
    assert_eq!(manifest_of(&out), digest);
    local_registry::sigstore_attachments(w, &addr);
    let by_skopeo = format!("{addr}/skopeo/app:v1");
    let out = chroot(
        &root,
        &inside,
        &format!(
            "skopeo --registries.d registries.d --policy accept.json copy --dest-tls-verify=false --sign-by-sigstore-private-key gpubake.key --sign-passphrase-file pass oci:layout:v1 docker://{by_skopeo}"
        ),
    );
    says(
        "skopeo copy --sign-by-sigstore-private-key",
        &out,
        0,
        "Signing image using a sigstore signature",
    );
    let image = format!("docker://{by_skopeo}");
    let out = gpubake(w, &["verify", &image, "--key", "gpubake.pub"]);
    says(
        "gpubake verify, skopeo's signature",
        &out,
        0,
        &format!("{digest} is signed with the key"),
    );
    let out = gpubake(w, &["verify", &image, "--key", "other.pub"]);
    says(
        "gpubake verify, skopeo's signature, another key",
        &out,
        1,
        "none accepted",
    );

    // 3. cosign verifies, offline, gpubake's simple signature and both bundles.
    let cosign_verify = |key: &str| {
        format!(
            "cosign verify --key {key} --insecure-ignore-tlog=true --allow-http-registry {signed}"
        )
    };
    let out = chroot(&root, &inside, &cosign_verify("gpubake.pub"));
    says(
        "cosign verify",
        &out,
        0,
        "The signatures were verified against the specified public key",
    );
    assert!(
        stdout(&out).contains(&format!(
            r#""docker-reference":"{signed}"}},"image":{{"docker-manifest-digest":"{digest}"}}"#
        )),
        "{}",
        stdout(&out)
    );
    let out = chroot(&root, &inside, &cosign_verify("other.pub"));
    says(
        "cosign verify, another key",
        &out,
        12,
        "Error: no matching signatures: invalid signature when validating ASN.1 encoded signature",
    );
    std::fs::write(
        w.join("trusted-root.json"),
        r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}"#,
    )
    .unwrap();
    let attestation = |key: &str, predicate: &str| {
        format!(
            "cosign verify-attestation --key {key} --new-bundle-format --insecure-ignore-tlog=true --trusted-root trusted-root.json --allow-http-registry --type {predicate} {signed}"
        )
    };
    let about_the_image = |out: &Output, predicate: &str| {
        let found = statements(out);
        assert_eq!(found.len(), 1, "{}", stdout(out));
        assert_eq!(found[0]["predicateType"], predicate);
        assert_eq!(
            found[0]["subject"][0]["digest"]["sha256"],
            digest.trim_start_matches("sha256:")
        );
    };
    let provenance = "https://slsa.dev/provenance/v1";
    let out = chroot(&root, &inside, &attestation("gpubake.pub", provenance));
    says(
        "cosign verify-attestation, provenance",
        &out,
        0,
        "The signatures were verified against the specified public key",
    );
    about_the_image(&out, provenance);
    let out = chroot(&root, &inside, &attestation("other.pub", provenance));
    says(
        "cosign verify-attestation, provenance, another key",
        &out,
        1,
        "accepted signatures do not match threshold, Found: 0, Expected 1",
    );
    let out = gpubake(
        w,
        &[
            "certify",
            &format!("docker://{signed}"),
            "--gpus",
            "none",
            "--attach",
            "--key",
            "gpubake.key",
            "--passphrase-file",
            "pass",
        ],
    );
    assert_exit(&out, 0);
    assert!(
        stderr(&out).contains("attached the signed certificate"),
        "{}",
        stderr(&out)
    );
    let certificate = "https://gpubake.io/certificate/v1";
    let out = chroot(&root, &inside, &attestation("gpubake.pub", certificate));
    says(
        "cosign verify-attestation, certificate",
        &out,
        0,
        "The signatures were verified against the specified public key",
    );
    about_the_image(&out, certificate);
    let out = chroot(&root, &inside, &attestation("other.pub", certificate));
    says(
        "cosign verify-attestation, certificate, another key",
        &out,
        1,
        "accepted signatures do not match threshold, Found: 0, Expected 1",
    );
    drop(registry);
}

/// The config digest (podman's image ID) of the manifest `digest`, read from the registry's
/// own storage under `w`.
fn config_of(w: &Path, digest: &str) -> String {
    let hex = digest.trim_start_matches("sha256:");
    let blob = w.join(format!(
        "registry/docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&blob).unwrap()).unwrap();
    manifest["config"]["digest"].as_str().unwrap().to_string()
}
