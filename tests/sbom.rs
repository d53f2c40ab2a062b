//! `build --sbom` on real images, each document checked by an independent validator: SPDX by
//! spdx-tools (`pyspdxtools -i`), CycloneDX by cyclonedx-python-lib's strict JSON schema
//! validator, both installed by scripts/test. A preflight image (busybox base, no Python) is
//! built through the command line; an image with the small real wheels of
//! tests/fixtures/pylock.small.toml over a Debian base is built through the library.

mod common;

use common::stack::build_options;
use common::{assert_exit, gpubake, have, write};
use gpubake::sbom::{Format, Subject};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// cyclonedx-python-lib's validator for CycloneDX 1.6 JSON: exit 1 with the schema's
/// complaint when the file is not a valid document.
const CYCLONEDX_VALIDATE: &str = "
import sys
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(open(sys.argv[1]).read())
if error is not None:
    print(error)
    sys.exit(1)
";

/// True when both validators run; in CI their absence fails the test.
fn validators() -> bool {
    if !have("pyspdxtools", "--help") {
        return false;
    }
    let cyclonedx = Command::new("python3")
        .args([
            "-c",
            "import cyclonedx.validation.json, jsonschema, referencing",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !cyclonedx {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs cyclonedx-python-lib[json-validation]; it must import"
        );
        eprintln!("skipped: cyclonedx-python-lib's JSON validator is not installed");
    }
    cyclonedx
}

/// Runs the independent validator of `format` on `path`: Ok, or Err with what it said.
fn validate(format: Format, path: &Path) -> Result<(), String> {
    let out = match format {
        Format::Spdx => Command::new("pyspdxtools").arg("-i").arg(path).output(),
        Format::Cyclonedx => Command::new("python3")
            .args(["-c", CYCLONEDX_VALIDATE])
            .arg(path)
            .output(),
    }
    .expect("the validator runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Validates `path` as `format`, then a copy broken by `breaking`, which must be refused: a
/// validator that accepts anything proves nothing.
fn assert_valid(format: Format, path: &Path, breaking: impl Fn(&mut Value)) {
    if let Err(e) = validate(format, path) {
        panic!("{} is not valid {format:?}:\n{e}", path.display());
    }
    let mut doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    breaking(&mut doc);
    let broken = path.with_extension("broken.json");
    std::fs::write(&broken, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    assert!(
        validate(format, &broken).is_err(),
        "the {format:?} validator accepted a broken document"
    );
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The digest of the manifest tagged `tag` in the layout at `dir`.
fn layout_digest(dir: &Path, tag: &str) -> String {
    let index = read_json(&dir.join("index.json"));
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap_or_else(|| panic!("no manifest tagged {tag} in {}", dir.display()))["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_preflight_image_gets_a_valid_sbom_in_either_format() {
    if !common::tools() || !validators() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(
        dir.path(),
        "recipe.yaml",
        "name: sbomtest\nbase: ubuntu:24.04\npytorch: '2.9'\npresets: [base]\n",
    );
    let build = |to: &Path, sbom: &Path, format: &str| -> Value {
        let to = format!("oci:{}:v1", to.display());
        let sbom = sbom.display().to_string();
        common::build_json_in(
            &common::root(),
            &recipe,
            &to,
            &["--sbom", &sbom, "--sbom-format", format],
        )
    };

    let spdx_path = dir.path().join("image.spdx.json");
    // A file being replaced keeps its mode, as every output of gpubake does.
    std::fs::write(&spdx_path, "old").unwrap();
    std::fs::set_permissions(
        &spdx_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let report = build(&dir.path().join("a"), &spdx_path, "spdx");
    assert_eq!(common::mode(&spdx_path), 0o600);
    let manifest = report["manifest"].as_str().unwrap();
    let base_digest = layout_digest(&common::base(), "latest");
    assert_eq!(report["base"], base_digest.as_str());

    let spdx = read_json(&spdx_path);
    let packages = spdx["packages"].as_array().unwrap();
    assert_eq!(packages.len(), 2, "the image and its base, no wheels");
    assert_eq!(packages[0]["versionInfo"], manifest);
    assert_eq!(packages[1]["versionInfo"], base_digest.as_str());
    let pins: Vec<&str> = packages[0]["annotations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["comment"].as_str().unwrap())
        .collect();
    for pin in ["torch", "cuda", "cudnn", "nccl", "python", "driver-min"] {
        let key = format!("gpubake:pin:{pin}=");
        assert!(
            pins.iter().any(|p| p.starts_with(&key)),
            "{key} in {pins:?}"
        );
    }
    assert_valid(Format::Spdx, &spdx_path, |doc| {
        // A relationship to a package the document does not have.
        doc["relationships"][1]["relatedSpdxElement"] = "SPDXRef-Nowhere".into();
    });

    let cdx_path = dir.path().join("image.cdx.json");
    build(&dir.path().join("a"), &cdx_path, "cyclonedx");
    assert_eq!(
        common::mode(&cdx_path) & 0o644,
        0o644,
        "a new file follows the umask"
    );
    let cdx = read_json(&cdx_path);
    assert_eq!(cdx["metadata"]["component"]["version"], manifest);
    assert_eq!(cdx["components"][0]["version"], base_digest.as_str());
    assert_valid(Format::Cyclonedx, &cdx_path, |doc| {
        doc["components"][0]["hashes"][0]["content"] = "not hex".into();
    });

    // The same recipe and base into another layout: the same image, the same bytes.
    let again = dir.path().join("again.spdx.json");
    build(&dir.path().join("b"), &again, "spdx");
    assert_eq!(
        std::fs::read(&spdx_path).unwrap(),
        std::fs::read(&again).unwrap(),
        "two builds of one recipe and base give one SBOM"
    );
}

/// A base read from a layout is named as it was given, by its digest, in the SBOM and the
/// image; the recipe's `base:` (`debian:bookworm`) is not claimed as a Docker Hub image.
#[test]
fn the_base_is_named_as_given_never_a_registry_it_did_not_come_from() {
    if !common::tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(
        dir.path(),
        "recipe.yaml",
        "name: provenance\nbase: debian:bookworm\npytorch: '2.9'\npresets: [base]\n",
    );
    let from = common::from_base();
    let base_digest = layout_digest(&common::base(), "latest");
    let layout = dir.path().join("out");
    let to = format!("oci:{}:v1", layout.display());
    let spdx_path = dir.path().join("p.spdx.json");
    let cdx_path = dir.path().join("p.cdx.json");
    for (path, format) in [(&spdx_path, "spdx"), (&cdx_path, "cyclonedx")] {
        let path = path.display().to_string();
        let out = gpubake(&common::build_args(
            &recipe,
            &from,
            &to,
            &["--sbom", &path, "--sbom-format", format],
        ));
        assert_exit(&out, 0);
    }
    let spdx = read_json(&spdx_path);
    let base = &spdx["packages"][1];
    let purl = base["externalRefs"][0]["referenceLocator"]
        .as_str()
        .unwrap();
    assert_eq!(
        purl,
        format!("pkg:oci/busybox-base@{base_digest}?tag=latest")
    );
    assert!(
        base["comment"]
            .as_str()
            .unwrap()
            .contains(&format!("read from `{from}`")),
        "{base}"
    );
    let cdx = read_json(&cdx_path);
    let component = &cdx["components"][0];
    assert_eq!(component["purl"], purl, "{component}");
    assert_eq!(component["properties"][0]["value"], from.as_str());
    assert!(!cdx.to_string().contains("docker.io"), "{cdx}");

    // The image: its base by digest, and not by a registry name it was not pulled from.
    let manifest: Value = serde_json::from_str(&common::run(
        Command::new("skopeo").args(["inspect", "--raw", &to]),
    ))
    .unwrap();
    let annotations = &manifest["annotations"];
    assert_eq!(
        annotations["org.opencontainers.image.base.digest"],
        base_digest.as_str(),
        "{manifest}"
    );
    assert!(
        annotations
            .get("org.opencontainers.image.base.name")
            .is_none(),
        "{manifest}"
    );
    let config: Value = serde_json::from_str(&common::run(
        Command::new("skopeo").args(["inspect", "--config", "--raw", &to]),
    ))
    .unwrap();
    let labels = &config["config"]["Labels"];
    assert!(
        labels.get("org.opencontainers.image.base.name").is_none(),
        "{labels}"
    );
}

#[test]
fn an_sbom_path_that_cannot_be_written_is_refused_before_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let to = format!("oci:{}:v1", dir.path().join("out").display());
    let out = gpubake(&[
        "build",
        "--without-python",
        "--to",
        &to,
        "--sbom",
        &dir.path().display().to_string(),
    ]);
    assert_exit(&out, 2);
    assert!(common::stderr(&out).contains("is a directory"));
    assert!(!dir.path().join("out").exists(), "nothing was built");
    let out = gpubake(&["build", "--to", &to, "--sbom-format", "cyclonedx"]);
    assert_exit(&out, 2);
}

#[test]
fn an_image_with_wheels_lists_each_with_its_hash_in_valid_documents() {
    if !validators() {
        return;
    }
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let text = "name: sbom-stack\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
                presets: [base]\n";
    let path = dir.path().join("recipe.yaml");
    std::fs::write(&path, text).unwrap();
    let (loaded, resolved) = common::stack::resolve_text(&path, text);
    let closure = gpubake::closure::parse(
        Path::new("pylock.small.toml"),
        include_str!("fixtures/pylock.small.toml"),
    )
    .unwrap();
    let wheels = closure.wheels.clone();
    let report = gpubake::bake::build(
        &loaded,
        &resolved,
        &build_options(
            &format!("oci:{}:bookworm", base.display()),
            &format!("oci:{}:v1", dir.path().join("out").display()),
            Some(closure),
        ),
    )
    .unwrap();
    let subject = Subject {
        lock: &resolved.lock,
        wheels: &wheels,
        base_digest: &report.base,
        base_source: &format!("oci:{}:bookworm", base.display()),
        base_packages: report.base_packages.as_ref(),
        image_digest: &report.manifest,
        epoch: 0,
        created: 0,
    };

    let spdx_path = dir.path().join("stack.spdx.json");
    gpubake::sbom::write(&spdx_path, Format::Spdx, &subject).unwrap();
    let spdx = read_json(&spdx_path);
    let packages = spdx["packages"].as_array().unwrap();
    for w in &wheels {
        assert!(
            packages.iter().any(|p| p["name"] == w.name.as_str()
                && p["checksums"][0]["checksumValue"] == w.sha256.as_str()
                && p["downloadLocation"] == w.url.as_str()),
            "{} with its sha256 and URL",
            w.name
        );
    }
    assert_valid(Format::Spdx, &spdx_path, |doc| {
        // SPDX checksums of SHA256 are 64 hex digits.
        doc["packages"][2]["checksums"][0]["checksumValue"] = "abc".into();
    });

    let cdx_path = dir.path().join("stack.cdx.json");
    gpubake::sbom::write(&cdx_path, Format::Cyclonedx, &subject).unwrap();
    let cdx = read_json(&cdx_path);
    let components = cdx["components"].as_array().unwrap();
    for w in &wheels {
        assert!(
            components
                .iter()
                .any(|c| c["name"] == w.name.as_str()
                    && c["hashes"][0]["content"] == w.sha256.as_str()),
            "{} with its sha256",
            w.name
        );
    }
    assert_valid(Format::Cyclonedx, &cdx_path, |doc| {
        doc["components"][1]["type"] = "wheel".into();
    });
}

/// Every .deb a `system:` build installs is in both documents as Syft and Trivy name it
/// (`pkg:deb/debian/NAME@VERSION?arch=…`), with the lock's sha256 and archive URL; the
/// packages the base's dpkg lists are there once each, as the base's (SPDX: the base
/// CONTAINS them; CycloneDX: nested in the base's component); the documents stay valid.
#[test]
fn the_debs_of_the_system_layer_are_listed_with_their_hashes_in_valid_documents() {
    if !validators() {
        return;
    }
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recipe = write(
        dir.path(),
        "recipe.yaml",
        "name: sbom-system\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
         presets: [base]\nsystem: [numactl, openssh-client]\n",
    );
    let lock_path = dir.path().join("lock.yaml");
    let spdx_path = dir.path().join("system.spdx.json");
    let cdx_path = dir.path().join("system.cdx.json");
    for (sbom, format) in [(&spdx_path, "spdx"), (&cdx_path, "cyclonedx")] {
        let out = gpubake(&[
            "build",
            "--without-python",
            &recipe,
            "--from",
            &format!("oci:{}:bookworm", base.display()),
            "--to",
            &format!("oci:{}:v1", dir.path().join("out").display()),
            "--lock-out",
            &lock_path.display().to_string(),
            "--sbom",
            &sbom.display().to_string(),
            "--sbom-format",
            format,
        ]);
        assert_exit(&out, 0);
    }
    let lock: gpubake::lock::Lock =
        serde_yaml::from_slice(&std::fs::read(&lock_path).unwrap()).unwrap();
    assert!(
        ["numactl", "openssh-client"]
            .iter()
            .all(|asked| lock.system.iter().any(|p| p.name == *asked)),
        "the lock pins what was asked: {:?}",
        lock.system
    );
    // The archive's Source field, kept where it is not the binary's name.
    let ssh = lock
        .system
        .iter()
        .find(|p| p.name == "openssh-client")
        .unwrap();
    assert_eq!(ssh.source.as_deref(), Some("openssh"));
    assert!(
        lock.system
            .iter()
            .any(|p| p.name == "numactl" && p.source.is_none())
    );

    let spdx = read_json(&spdx_path);
    let packages = spdx["packages"].as_array().unwrap();
    let relationships = spdx["relationships"].as_array().unwrap();
    let contained_by = |from: &str| -> Vec<&Value> {
        packages
            .iter()
            .filter(|p| {
                relationships.iter().any(|r| {
                    r["spdxElementId"] == from
                        && r["relationshipType"] == "CONTAINS"
                        && r["relatedSpdxElement"] == p["SPDXID"]
                })
            })
            .collect()
    };
    assert_eq!(
        contained_by("SPDXRef-Image").len(),
        lock.system.len(),
        "the image CONTAINS every .deb of the lock"
    );
    let ssh_spdx = packages
        .iter()
        .find(|p| p["name"] == "openssh-client")
        .unwrap();
    assert_eq!(
        ssh_spdx["sourceInfo"],
        "built from the source package openssh"
    );
    let of_base = contained_by("SPDXRef-Base");
    assert_eq!(
        packages.len(),
        2 + lock.system.len() + of_base.len(),
        "the image, its base, every .deb of the lock and the base's own packages"
    );
    let purl_of = |p: &Value| {
        p["externalRefs"][0]["referenceLocator"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let mut purls: Vec<String> = packages.iter().skip(2).map(purl_of).collect();
    let listed = purls.len();
    purls.sort();
    purls.dedup();
    assert_eq!(purls.len(), listed, "no package twice with one purl");
    let cdx = read_json(&cdx_path);
    let components = cdx["components"].as_array().unwrap();
    let nested = components[0]["components"]
        .as_array()
        .expect("the base's packages, nested in its component");
    assert_eq!(
        nested.len(),
        of_base.len(),
        "the same packages in both documents"
    );
    for name in ["libc6", "dpkg", "base-files"] {
        let under: Vec<&&Value> = of_base.iter().filter(|p| p["name"] == name).collect();
        assert_eq!(under.len(), 1, "{name} once under the base: {of_base:?}");
        let p = under[0];
        let purl = purl_of(p);
        assert!(
            purl.starts_with(&format!("pkg:deb/debian/{name}@")),
            "{purl}"
        );
        assert_eq!(p["downloadLocation"], "NOASSERTION");
        assert!(
            p.get("checksums").is_none(),
            "dpkg's status has no hash: {p}"
        );
        let c: Vec<&Value> = nested.iter().filter(|c| c["name"] == name).collect();
        assert_eq!(c.len(), 1, "{name} once nested in the base");
        assert_eq!(c[0]["purl"], purl.as_str());
        assert!(
            c[0]["properties"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!({"name": "gpubake:layer", "value": "base"})),
            "{}",
            c[0]
        );
        assert!(
            !components.iter().any(|top| top["purl"] == purl.as_str()),
            "{purl} is the base's, not a component of its own"
        );
    }
    for deb in &lock.system {
        let purl = gpubake::sbom::deb_purl(deb);
        assert!(
            purl.starts_with(&format!("pkg:deb/debian/{}@", deb.name)),
            "{purl}"
        );
        assert!(
            packages.iter().any(|p| p["name"] == deb.name.as_str()
                && p["versionInfo"] == deb.version.as_str()
                && p["checksums"][0]["checksumValue"] == deb.sha256.as_str()
                && p["downloadLocation"] == deb.url.as_str()
                && p["externalRefs"][0]["referenceLocator"] == purl.as_str()),
            "{} {} with its sha256, URL and purl in the SPDX packages",
            deb.name,
            deb.version
        );
        assert!(
            components
                .iter()
                .any(|c| c["purl"] == purl.as_str()
                    && c["hashes"][0]["content"] == deb.sha256.as_str()),
            "{purl} with its sha256 in the CycloneDX components"
        );
    }
    assert_valid(Format::Spdx, &spdx_path, |doc| {
        doc["packages"][2]["checksums"][0]["checksumValue"] = "abc".into();
    });
    assert_valid(Format::Cyclonedx, &cdx_path, |doc| {
        doc["components"][1]["type"] = "deb".into();
    });
}
