//! The build's provenance: an in-toto statement with an SLSA provenance v1 predicate about
//! the built manifest, every wheel of the closure in it by digest, signed in a Sigstore
//! bundle; two builds of one lock give the same subject and the same provenance apart from
//! the run's timestamps. Built through the library, as tests/sbom.rs builds its image with
//! wheels, on the real Debian base.

mod common;

use common::stack::build_options;
use gpubake::bake::provenance::{self, Run};
use gpubake::sbom::Subject;
use gpubake::sign::bundle::Bundle;
use gpubake::sign::keys::PrivateKey;
use serde_json::Value;
use std::path::Path;

#[test]
fn two_builds_of_one_lock_have_one_subject_and_one_provenance_but_for_its_times() {
    let Some(base) = common::debian_base() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let text = "name: provenance\nbase: debian:bookworm\npython: \"3.11\"\npytorch: \"2.9\"\n\
                presets: [base]\n";
    let path = dir.path().join("recipe.yaml");
    std::fs::write(&path, text).unwrap();
    let (loaded, resolved) = common::stack::resolve_text(&path, text);
    let from = format!("oci:{}:bookworm", base.display());
    let key = PrivateKey::generate();
    let mut statements = Vec::new();
    for (n, (started, finished)) in [
        ("2026-12-03T10:00:00Z", "2026-12-03T10:01:00Z"),
        ("2026-12-04T11:00:00Z", "2026-12-04T11:02:30Z"),
    ]
    .into_iter()
    .enumerate()
    {
        let closure = gpubake::closure::parse(
            Path::new("pylock.small.toml"),
            include_str!("fixtures/pylock.small.toml"),
        )
        .unwrap();
        let wheels = closure.wheels.clone();
        let to = format!("oci:{}:v1", dir.path().join(format!("out{n}")).display());
        let report = gpubake::bake::build(
            &loaded,
            &resolved,
            &build_options(&from, &to, Some(closure)),
        )
        .unwrap();
        let subject = Subject {
            lock: &resolved.lock,
            wheels: &wheels,
            base_digest: &report.base,
            base_source: &from,
            base_packages: report.base_packages.as_ref(),
            image_digest: &report.manifest,
            epoch: 0,
            created: 0,
        };
        let run = Run {
            started: started.into(),
            finished: finished.into(),
        };
        let statement = provenance::statement("registry.example/team/app:v1", &subject, &run);
        // What a verifier reads back from the signed bundle.
        let bundle = Bundle::sign(&statement, &key);
        let read = Bundle::from_slice(&serde_json::to_vec(&bundle).unwrap()).unwrap();
        let verified = read.verify(&key.public()).unwrap();
        assert_eq!(verified, statement);
        assert!(verified.about(report.manifest.as_str()));
        let deps = statement.predicate["buildDefinition"]["resolvedDependencies"]
            .as_array()
            .unwrap()
            .clone();
        for w in &wheels {
            assert!(
                deps.iter()
                    .any(|d| d["uri"] == w.url.as_str()
                        && d["digest"]["sha256"] == w.sha256.as_str()),
                "{} by its sha256 in {deps:#?}",
                w.name
            );
        }
        let recipe_sha = &resolved.lock.recipe.sha256;
        assert!(
            deps.iter()
                .any(|d| d["digest"]["sha256"] == recipe_sha.as_str())
        );
        assert!(deps.iter().any(|d| d["annotations"]["role"] == "base"
            && d["digest"]["sha256"] == report.base.trim_start_matches("sha256:")));
        assert_eq!(
            statement.predicate["runDetails"]["builder"]["version"]["gpubake"],
            env!("CARGO_PKG_VERSION")
        );
        statements.push((
            report.manifest.clone(),
            serde_json::to_value(&statement).unwrap(),
        ));
    }
    let ((first_digest, mut first), (second_digest, mut second)) =
        (statements[0].clone(), statements[1].clone());
    assert_eq!(first_digest, second_digest, "one lock, one image");
    assert_ne!(first, second, "the runs' times differ");
    let times = |s: &mut Value| s["predicate"]["runDetails"]["metadata"].take();
    assert_eq!(times(&mut first)["startedOn"], "2026-12-03T10:00:00Z");
    times(&mut second);
    assert_eq!(first, second, "all but the times is the same");
}
