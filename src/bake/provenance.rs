//! The build's provenance: an in-toto statement about the built manifest with an SLSA
//! provenance v1 predicate. What went in is listed by digest: the recipe, the base image,
//! every wheel of the Python closure and every .deb of the system packages; nothing in it
//! depends on the machine or the time except `runDetails.metadata`, so two builds of one lock
//! differ only there.

use crate::sbom::Subject;
use crate::sign::statement::{Descriptor, Statement};
use serde_json::json;

/// SLSA provenance v1.
pub const PREDICATE: &str = "https://slsa.dev/provenance/v1";
/// What kind of build this is, for a verifier to know how to read `externalParameters`.
pub const BUILD_TYPE: &str = "https://gpubake.io/build/v1";
/// Who built it.
pub const BUILDER: &str = "https://gpubake.io/gpubake";

/// When the build ran, for `runDetails.metadata`: the only part that differs between two
/// builds of one lock.
pub struct Run {
    /// RFC 3339, UTC.
    pub started: String,
    /// RFC 3339, UTC.
    pub finished: String,
}

/// The provenance of the image `subject` describes, named `image` (its reference).
pub fn statement(image: &str, subject: &Subject, run: &Run) -> Statement {
    let lock = subject.lock;
    let mut deps = vec![
        Descriptor {
            name: lock.recipe.file.clone(),
            digest: [("sha256".to_string(), lock.recipe.sha256.clone())].into(),
            annotations: [("role".to_string(), json!("recipe"))].into(),
            ..Descriptor::default()
        },
        Descriptor {
            uri: subject.base_source.to_string(),
            annotations: [("role".to_string(), json!("base"))].into(),
            ..Descriptor::of(&lock.base, subject.base_digest)
        },
    ];
    for w in subject.wheels {
        deps.push(Descriptor {
            name: w.file_name(),
            uri: w.url.clone(),
            digest: [("sha256".to_string(), w.sha256.clone())].into(),
            ..Descriptor::default()
        });
    }
    for p in &lock.system {
        deps.push(Descriptor {
            name: format!("{}_{}_{}.deb", p.name, p.version, p.architecture),
            uri: p.url.clone(),
            digest: [("sha256".to_string(), p.sha256.clone())].into(),
            media_type: "application/vnd.debian.binary-package".into(),
            ..Descriptor::default()
        });
    }
    Statement::new(
        vec![Descriptor::of(image, subject.image_digest)],
        PREDICATE,
        json!({
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "recipe": lock.recipe.file,
                    "base": lock.base,
                    "sourceDateEpoch": subject.epoch,
                },
                "internalParameters": {
                    "torch": lock.torch.version.to_string(),
                    "cuda": lock.cuda.version.to_string(),
                    "platforms": lock.platforms,
                },
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {
                    "id": BUILDER,
                    "version": {"gpubake": env!("CARGO_PKG_VERSION")},
                },
                "metadata": {"startedOn": run.started, "finishedOn": run.finished},
            },
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{Lock, SystemPackage};

    /// Every .deb of the lock's system packages is a resolved dependency, by its digest,
    /// beside the recipe and the base.
    #[test]
    fn every_system_package_is_a_dependency_by_its_digest() {
        let mut lock: Lock =
            serde_yaml::from_str(include_str!("../../fuzz/corpus/lock/l40s-pcie.lock.yaml"))
                .unwrap();
        for (name, version, arch) in [
            ("numactl", "2.0.16-1", "amd64"),
            ("tzdata", "2025b-0+deb12u1", "all"),
        ] {
            lock.system.push(SystemPackage {
                name: name.into(),
                version: version.into(),
                architecture: arch.into(),
                url: format!("http://deb.debian.org/debian/pool/main/{name}_{version}_{arch}.deb"),
                size: 1000,
                sha256: format!("{:0>64}", name.len()),
                source: None,
            });
        }
        let subject = crate::sbom::Subject {
            lock: &lock,
            wheels: &[],
            base_digest: "sha256:00",
            base_source: "oci:base:bookworm",
            base_packages: None,
            image_digest: "sha256:ff",
            epoch: 0,
            created: 0,
        };
        let run = Run {
            started: "2026-12-03T10:00:00Z".into(),
            finished: "2026-12-03T10:01:00Z".into(),
        };
        let s = statement("registry.example/app:v1", &subject, &run);
        let deps = s.predicate["buildDefinition"]["resolvedDependencies"]
            .as_array()
            .unwrap();
        for p in &lock.system {
            let dep = deps
                .iter()
                .find(|d| d["uri"] == p.url.as_str())
                .unwrap_or_else(|| panic!("{} not in {deps:#?}", p.name));
            assert_eq!(dep["digest"]["sha256"], p.sha256.as_str());
            assert_eq!(
                dep["name"],
                format!("{}_{}_{}.deb", p.name, p.version, p.architecture)
            );
            assert_eq!(dep["mediaType"], "application/vnd.debian.binary-package");
        }
        assert_eq!(deps.len(), 2 + lock.system.len(), "recipe, base, the .debs");
    }
}
