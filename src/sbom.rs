//! The software bill of materials of a built image, as SPDX 2.3 JSON or CycloneDX 1.6 JSON:
//! the image itself, the base it was built on (by the digest really used) with the packages
//! its dpkg records as installed, every wheel of the Python closure and every .deb of the
//! `system:` layer with its sha256 and download URL, and the lock's pins.
//!
//! The document is made from plain facts: the lock, the closure's wheels, the two manifest
//! digests and the build's timestamp. Nothing in it is random or read from the clock, so the
//! same lock and base give the same bytes; the SPDX namespace and the CycloneDX serial number
//! are derived from the image's digest.

use crate::error::{Error, Result};
use crate::lock::{Lock, SystemPackage};
use crate::wheel::cache::WheelRef;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::path::Path;

/// The two document formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// SPDX 2.3, JSON (conventionally `*.spdx.json`).
    Spdx,
    /// CycloneDX 1.6, JSON (conventionally `*.cdx.json`).
    Cyclonedx,
}

impl Format {
    /// The document's media type, which is also its artifact type as a referrer.
    pub fn media_type(self) -> &'static str {
        match self {
            Format::Spdx => "application/spdx+json",
            Format::Cyclonedx => "application/vnd.cyclonedx+json",
        }
    }
}

/// A package the base's dpkg records as installed (/var/lib/dpkg/status). dpkg keeps no hash
/// of the .deb a package came from nor where it was downloaded, so the documents give none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasePackage {
    /// `Package`.
    pub name: String,
    /// `Version`, as dpkg writes it (with its epoch).
    pub version: String,
    /// `Architecture`.
    pub architecture: String,
    /// The source package: `Source` without the version in parentheses, else the package's
    /// own name, as dpkg-query's `${source:Package}` gives it.
    pub source: String,
}

/// The base's installed packages and the distribution they belong to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BasePackages {
    /// The purl's vendor: os-release's `ID` (`debian`, `ubuntu`), as Syft names it.
    pub vendor: String,
    /// In dpkg's order.
    pub packages: Vec<BasePackage>,
}

impl BasePackages {
    /// From the base's dpkg status and os-release text (`at` names the status in errors).
    pub fn parse(status: &str, os_release: Option<&str>, at: &str) -> Result<BasePackages> {
        let vendor = os_release
            .map(|text| crate::debian::sources::parse_os_release(text).id)
            .filter(|id| !id.is_empty())
            .map_or_else(|| "debian".to_string(), |id| id.to_ascii_lowercase());
        let packages = crate::debian::status::parse(status, at)?
            .into_iter()
            .map(|p| BasePackage {
                source: p.source.clone().unwrap_or_else(|| p.name.clone()),
                name: p.name,
                version: p.version.to_string(),
                architecture: p.architecture,
            })
            .collect();
        Ok(BasePackages { vendor, packages })
    }

    /// `pkg:deb/VENDOR/NAME@VERSION?arch=ARCH[&epoch=N]`, as [`deb_purl`] writes a .deb of
    /// the system layer, so that one package reinstalled there has one purl.
    pub fn purl(&self, p: &BasePackage) -> String {
        purl_of_deb(&self.vendor, &p.name, &p.version, &p.architecture)
    }

    /// The packages to list under the base: each but those whose purl the system layer's
    /// .debs have (a package reinstalled at the same version), which the image lists once, as
    /// the system layer's, with its hash.
    fn listed<'a>(&'a self, system: &[SystemPackage]) -> Vec<(&'a BasePackage, String)> {
        let layer: HashSet<String> = system.iter().map(deb_purl).collect();
        self.packages
            .iter()
            .map(|p| (p, self.purl(p)))
            .filter(|(_, purl)| !layer.contains(purl))
            .collect()
    }
}

/// What an SBOM is made from.
#[derive(Clone, Debug)]
pub struct Subject<'a> {
    /// The lock the image was built from.
    pub lock: &'a Lock,
    /// The wheels the image installs; empty for an image without the Python stack.
    pub wheels: &'a [WheelRef],
    /// The digest of the base image's manifest (`sha256:…`).
    pub base_digest: &'a str,
    /// The base as the build read it: `--from` as given (`oci:../base:bookworm`,
    /// `docker-daemon:NAME:TAG`, `docker://…`), or the recipe's base pulled from its registry.
    /// A base from a layout, an archive or the engine names no registry.
    pub base_source: &'a str,
    /// The packages the base's dpkg lists; None for a base without dpkg.
    pub base_packages: Option<&'a BasePackages>,
    /// The digest of the built image's manifest (`sha256:…`).
    pub image_digest: &'a str,
    /// The build's file timestamp (`SOURCE_DATE_EPOCH`, else 0).
    pub epoch: u64,
    /// The image's creation time, which the document is dated by.
    pub created: u64,
}

/// The wheels an SBOM lists from several platforms' closures: each once, by its sha256, in
/// the order the closures first name them.
pub fn wheels_once<'a>(wheels: impl IntoIterator<Item = &'a WheelRef>) -> Vec<WheelRef> {
    let mut once: Vec<WheelRef> = Vec::new();
    for w in wheels {
        if !once.iter().any(|have| have.sha256 == w.sha256) {
            once.push(w.clone());
        }
    }
    once
}

/// The name that tools write in `creators` and `metadata.tools`.
const TOOL: &str = "gpubake";

impl Subject<'_> {
    /// The document in `format`, as the bytes written to a file.
    pub fn render(&self, format: Format) -> Result<Vec<u8>> {
        let doc = match format {
            Format::Spdx => self.spdx()?,
            Format::Cyclonedx => self.cyclonedx()?,
        };
        let mut bytes = serde_json::to_vec_pretty(&doc).expect("JSON values serialize");
        bytes.push(b'\n');
        Ok(bytes)
    }

    /// The SPDX 2.3 document: the image DESCENDANT_OF its base and CONTAINS every wheel and
    /// every .deb of its system layer; the base CONTAINS its own dpkg packages; the pins are
    /// annotations of the image.
    pub fn spdx(&self) -> Result<Value> {
        let image_hex = sha256_hex(self.image_digest, "the image's manifest digest")?;
        let base_hex = sha256_hex(self.base_digest, "the base's manifest digest")?;
        let created = crate::units::rfc3339(self.created);
        let creator = format!("Tool: {TOOL}-{}", env!("CARGO_PKG_VERSION"));
        let lock = self.lock;
        let base = ImageName::parse(self.base_source);

        let annotations: Vec<Value> = self
            .pins()
            .into_iter()
            .map(|(name, value)| {
                json!({
                    "annotationDate": created,
                    "annotationType": "OTHER",
                    "annotator": creator,
                    "comment": format!("{name}={value}"),
                })
            })
            .collect();
        let mut packages = vec![
            json!({
                "SPDXID": "SPDXRef-Image",
                "name": lock.recipe.name,
                "versionInfo": self.image_digest,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": false,
                "primaryPackagePurpose": "CONTAINER",
                "checksums": [{"algorithm": "SHA256", "checksumValue": image_hex}],
                "externalRefs": [purl_ref(&oci_purl(&lock.recipe.name, None, None, self.image_digest))],
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": "NOASSERTION",
                "copyrightText": "NOASSERTION",
                "comment": format!(
                    "the image of recipe `{}` built by gpubake; the checksum is its manifest's",
                    lock.recipe.name
                ),
                "annotations": annotations,
            }),
            json!({
                "SPDXID": "SPDXRef-Base",
                "name": base.name,
                "versionInfo": self.base_digest,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": false,
                "primaryPackagePurpose": "CONTAINER",
                "checksums": [{"algorithm": "SHA256", "checksumValue": base_hex}],
                "externalRefs": [purl_ref(&base.purl(self.base_digest))],
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": "NOASSERTION",
                "copyrightText": "NOASSERTION",
                "comment": format!(
                    "the base image, read from `{}` (`{}` in the recipe); the checksum is its \
                     manifest's",
                    self.base_source, lock.base
                ),
            }),
        ];
        let mut relationships = vec![
            relationship("SPDXRef-DOCUMENT", "DESCRIBES", "SPDXRef-Image"),
            relationship("SPDXRef-Image", "DESCENDANT_OF", "SPDXRef-Base"),
        ];
        let mut taken = HashSet::new();
        for wheel in self.wheels {
            let id = unique_spdx_id(&mut taken, &wheel.name);
            let mut package = Artifact {
                name: &wheel.name,
                version: &wheel.version,
                file_name: &wheel.file_name(),
                url: &wheel.url,
                sha256: &wheel.sha256,
                purl: &pypi_purl(wheel),
            }
            .spdx_package(&id);
            package["primaryPackagePurpose"] = json!("LIBRARY");
            packages.push(package);
            relationships.push(relationship("SPDXRef-Image", "CONTAINS", &id));
        }
        for deb in &lock.system {
            let id = unique_spdx_id(&mut taken, &format!("deb-{}", deb.name));
            let mut package = deb_artifact(deb, &deb_purl(deb)).spdx_package(&id);
            package["comment"] = json!("an OS package the image's system layer installs");
            package["sourceInfo"] = json!(format!(
                "built from the source package {}",
                deb.source.as_deref().unwrap_or(&deb.name)
            ));
            packages.push(package);
            relationships.push(relationship("SPDXRef-Image", "CONTAINS", &id));
        }
        // Last, so that the packages gpubake installed keep their places whatever the base.
        if let Some(base_packages) = self.base_packages {
            for (p, purl) in base_packages.listed(&lock.system) {
                let id = unique_spdx_id(&mut taken, &format!("base-{}", p.name));
                packages.push(json!({
                    "SPDXID": id,
                    "name": p.name,
                    "versionInfo": p.version,
                    // dpkg's status says neither where the .deb came from nor its hash.
                    "downloadLocation": "NOASSERTION",
                    "filesAnalyzed": false,
                    "sourceInfo": format!("built from the source package {}", p.source),
                    "externalRefs": [purl_ref(&purl)],
                    "licenseConcluded": "NOASSERTION",
                    "licenseDeclared": "NOASSERTION",
                    "copyrightText": "NOASSERTION",
                    "comment": "an OS package of the base image, as its dpkg status lists it",
                }));
                relationships.push(relationship("SPDXRef-Base", "CONTAINS", &id));
            }
        }
        Ok(json!({
            "spdxVersion": "SPDX-2.3",
            "dataLicense": "CC0-1.0",
            "SPDXID": "SPDXRef-DOCUMENT",
            "name": format!("{}@{}", lock.recipe.name, self.image_digest),
            "documentNamespace": format!(
                "urn:uuid:{}",
                name_uuid(&format!("spdx {}", self.image_digest))
            ),
            "creationInfo": {"created": created, "creators": [creator]},
            "documentDescribes": ["SPDXRef-Image"],
            "packages": packages,
            "relationships": relationships,
        }))
    }

    /// The CycloneDX 1.6 document: the image is the BOM's subject, with its base as a
    /// pedigree ancestor; the base, every wheel and every .deb are components, the image
    /// depends on each; the base's own dpkg packages are components nested in the base's
    /// (Syft reads nested components as the image's packages), each also marked
    /// `gpubake:layer` = `base`; the pins are properties of the image.
    pub fn cyclonedx(&self) -> Result<Value> {
        let image_hex = sha256_hex(self.image_digest, "the image's manifest digest")?;
        let base_hex = sha256_hex(self.base_digest, "the base's manifest digest")?;
        let lock = self.lock;
        let base = ImageName::parse(self.base_source);
        let base_purl = base.purl(self.base_digest);
        let image_purl = oci_purl(&lock.recipe.name, None, None, self.image_digest);

        let base_component = |bom_ref: bool| {
            let mut c = json!({
                "type": "container",
                "name": base.name,
                "version": self.base_digest,
                "purl": base_purl,
                "hashes": [{"alg": "SHA-256", "content": base_hex}],
                "properties": [
                    {"name": "gpubake:base:reference", "value": self.base_source},
                    {"name": "gpubake:base:recipe", "value": lock.base},
                ],
            });
            if bom_ref {
                c["bom-ref"] = json!(base_purl);
            }
            c
        };
        let mut base = base_component(true);
        let mut nested = Vec::new();
        if let Some(base_packages) = self.base_packages {
            for (p, purl) in base_packages.listed(&lock.system) {
                nested.push(json!({
                    "type": "library",
                    "bom-ref": purl,
                    "name": p.name,
                    "version": p.version,
                    "purl": purl,
                    "properties": [
                        {"name": "gpubake:layer", "value": "base"},
                        {"name": "gpubake:deb:source", "value": p.source},
                    ],
                }));
            }
        }
        if !nested.is_empty() {
            base["components"] = json!(nested);
        }
        let mut components = vec![base];
        let mut depends_on = vec![json!(base_purl)];
        for wheel in self.wheels {
            let purl = pypi_purl(wheel);
            let mut properties =
                vec![json!({"name": "gpubake:wheel:file", "value": wheel.file_name()})];
            if let Some(size) = wheel.size {
                properties.push(json!({"name": "gpubake:wheel:size", "value": size.to_string()}));
            }
            components.push(
                Artifact {
                    name: &wheel.name,
                    version: &wheel.version,
                    file_name: &wheel.file_name(),
                    url: &wheel.url,
                    sha256: &wheel.sha256,
                    purl: &purl,
                }
                .cyclonedx_component(properties),
            );
            depends_on.push(json!(purl));
        }
        for deb in &lock.system {
            let purl = deb_purl(deb);
            components.push(deb_artifact(deb, &purl).cyclonedx_component(vec![
                json!({"name": "gpubake:deb:file", "value": deb_file_name(deb)}),
                json!({"name": "gpubake:deb:size", "value": deb.size.to_string()}),
                json!({"name": "gpubake:deb:source", "value": deb.source.as_deref().unwrap_or(&deb.name)}),
            ]));
            depends_on.push(json!(purl));
        }
        let properties: Vec<Value> = self
            .pins()
            .into_iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect();
        let mut dependencies = vec![json!({"ref": image_purl, "dependsOn": depends_on})];
        // Every component appears in the graph, with what it depends on unknown to the lock;
        // the base's packages after the base.
        for c in &components {
            dependencies.push(json!({"ref": c["bom-ref"], "dependsOn": []}));
            for inner in c["components"].as_array().into_iter().flatten() {
                dependencies.push(json!({"ref": inner["bom-ref"], "dependsOn": []}));
            }
        }
        Ok(json!({
            "bomFormat": "CycloneDX",
            "specVersion": "1.6",
            "serialNumber": format!(
                "urn:uuid:{}",
                name_uuid(&format!("cyclonedx {}", self.image_digest))
            ),
            "version": 1,
            "metadata": {
                "timestamp": crate::units::rfc3339(self.created),
                "tools": {"components": [{
                    "type": "application",
                    "name": TOOL,
                    "version": env!("CARGO_PKG_VERSION"),
                }]},
                "component": {
                    "type": "container",
                    "bom-ref": image_purl,
                    "name": lock.recipe.name,
                    "version": self.image_digest,
                    "purl": image_purl,
                    "hashes": [{"alg": "SHA-256", "content": image_hex}],
                    "pedigree": {"ancestors": [base_component(false)]},
                    "properties": properties,
                },
            },
            "components": components,
            "dependencies": dependencies,
        }))
    }

    /// The lock's pins, as `gpubake:pin:NAME` and a value, the same in both formats.
    fn pins(&self) -> Vec<(String, String)> {
        let lock = self.lock;
        let known = |v: &Option<crate::version::Version>| {
            v.as_ref()
                .map(ToString::to_string)
                .unwrap_or_else(|| "unknown".into())
        };
        let mut pins = vec![
            ("torch", lock.torch.version.to_string()),
            ("torch-build", lock.torch.variant.clone()),
            ("cuda", lock.cuda.version.to_string()),
            ("cudnn", known(&lock.cudnn.version)),
            ("nccl", known(&lock.nccl.version)),
            ("python", known(&lock.python.version)),
            ("driver-min", lock.driver.min.to_string()),
        ];
        if let Some(v) = &lock.driver.recommended {
            pins.push(("driver-recommended", v.to_string()));
        }
        if let Some(v) = &lock.driver.fleet {
            pins.push(("driver-fleet", v.to_string()));
        }
        let mut out: Vec<(String, String)> = pins
            .into_iter()
            .map(|(k, v)| (format!("gpubake:pin:{k}"), v))
            .collect();
        out.push(("gpubake:recipe".into(), lock.recipe.name.clone()));
        out.push(("gpubake:recipe:sha256".into(), lock.recipe.sha256.clone()));
        out.push((
            "gpubake:python-stack".into(),
            if self.wheels.is_empty() {
                "none".into()
            } else {
                format!("{} wheels", self.wheels.len())
            },
        ));
        out
    }
}

/// Writes the SBOM of `subject` to `path` atomically, keeping the mode of a file it replaces.
pub fn write(path: &Path, format: Format, subject: &Subject) -> Result<()> {
    crate::fsutil::write_atomic(path, &subject.render(format)?)
}

/// The hex of a `sha256:` digest; the digests come from gpubake's own build, so another form
/// is a fault worth naming rather than writing into a document.
fn sha256_hex<'a>(digest: &'a str, what: &str) -> Result<&'a str> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| Error::Usage(format!("{what} `{digest}` is not a sha256 digest")))
}

fn relationship(from: &str, kind: &str, to: &str) -> Value {
    json!({
        "spdxElementId": from,
        "relationshipType": kind,
        "relatedSpdxElement": to,
    })
}

fn purl_ref(purl: &str) -> Value {
    json!({
        "referenceCategory": "PACKAGE-MANAGER",
        "referenceType": "purl",
        "referenceLocator": purl,
    })
}

/// An SPDX identifier for a wheel (`SPDXRef-Wheel-NAME`, letters, digits, `.` and `-` only),
/// made unique with a number should two names collapse to one.
fn unique_spdx_id(taken: &mut HashSet<String>, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut id = format!("SPDXRef-Wheel-{clean}");
    let mut n = 2;
    while !taken.insert(id.clone()) {
        id = format!("SPDXRef-Wheel-{clean}-{n}");
        n += 1;
    }
    id
}

/// A name-based UUID (RFC 9562 version 8, from SHA-256, as its appendix B.2 shows): the same
/// name always gives the same UUID, so the document's identity follows the image's.
fn name_uuid(name: &str) -> String {
    let hash = Sha256::digest(format!("gpubake sbom\n{name}").as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&hash[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Percent-encodes a purl component: everything but letters, digits, `.-_~` and `:` (which the
/// purl specification leaves unencoded everywhere), plus `/` where `keep_slash`.
fn purl_encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'.' | b'-' | b'_' | b'~' | b':')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A downloaded file the image installs (a wheel, a .deb), as both formats list it.
struct Artifact<'a> {
    name: &'a str,
    version: &'a str,
    file_name: &'a str,
    url: &'a str,
    sha256: &'a str,
    purl: &'a str,
}

impl Artifact<'_> {
    /// Its SPDX package, with the given SPDX id.
    fn spdx_package(&self, id: &str) -> Value {
        json!({
            "SPDXID": id,
            "name": self.name,
            "versionInfo": self.version,
            "packageFileName": self.file_name,
            "downloadLocation": self.url,
            "filesAnalyzed": false,
            "checksums": [{"algorithm": "SHA256", "checksumValue": self.sha256}],
            "externalRefs": [purl_ref(self.purl)],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
        })
    }

    /// Its CycloneDX library component, referred to by its purl.
    fn cyclonedx_component(&self, properties: Vec<Value>) -> Value {
        json!({
            "type": "library",
            "bom-ref": self.purl,
            "name": self.name,
            "version": self.version,
            "purl": self.purl,
            "hashes": [{"alg": "SHA-256", "content": self.sha256}],
            "externalReferences": [{
                "type": "distribution",
                "url": self.url,
                "hashes": [{"alg": "SHA-256", "content": self.sha256}],
            }],
            "properties": properties,
        })
    }
}

fn deb_artifact<'a>(deb: &'a SystemPackage, purl: &'a str) -> Artifact<'a> {
    Artifact {
        name: &deb.name,
        version: &deb.version,
        file_name: deb_file_name(deb),
        url: &deb.url,
        sha256: &deb.sha256,
        purl,
    }
}

/// The .deb's file name: the last part of its archive URL.
fn deb_file_name(deb: &SystemPackage) -> &str {
    deb.url.rsplit('/').next().unwrap_or(&deb.url)
}

/// `pkg:deb/VENDOR/NAME@VERSION?arch=ARCH[&epoch=N]`, as Syft and Trivy write a .deb: the
/// vendor is `ubuntu` for a package fetched from an Ubuntu archive (its URL before `/pool/`)
/// and `debian` otherwise;
/// an epoch leaves the version for a qualifier of its own.
pub fn deb_purl(deb: &SystemPackage) -> String {
    // The archive's root, before `/pool/`: a Debian package named ubuntu-… stays Debian's.
    let root = deb.url.split("/pool/").next().unwrap_or(&deb.url);
    let vendor = if root.to_ascii_lowercase().contains("ubuntu") {
        "ubuntu"
    } else {
        "debian"
    };
    purl_of_deb(vendor, &deb.name, &deb.version, &deb.architecture)
}

/// `pkg:deb/VENDOR/NAME@VERSION?arch=ARCH[&epoch=N]`: an epoch leaves the version for a
/// qualifier of its own.
fn purl_of_deb(vendor: &str, name: &str, version: &str, architecture: &str) -> String {
    let (epoch, version) = match version.split_once(':') {
        Some((epoch, rest)) if !epoch.is_empty() && epoch.bytes().all(|b| b.is_ascii_digit()) => {
            (Some(epoch), rest)
        }
        _ => (None, version),
    };
    let mut purl = format!(
        "pkg:deb/{}/{}@{}?arch={}",
        purl_encode(vendor, false),
        purl_encode(name, false),
        purl_encode(version, false),
        purl_encode(architecture, false)
    );
    if let Some(epoch) = epoch {
        purl.push_str(&format!("&epoch={epoch}"));
    }
    purl
}

/// `pkg:pypi/NAME@VERSION?file_name=FILE`: the name normalized as PyPI's purl type asks
/// (lower case, `_` as `-`), the wheel's file named by the qualifier the type defines.
pub fn pypi_purl(wheel: &WheelRef) -> String {
    format!(
        "pkg:pypi/{}@{}?file_name={}",
        purl_encode(&crate::names::normalize(&wheel.name), false),
        purl_encode(&wheel.version, false),
        purl_encode(&wheel.file_name(), false)
    )
}

/// `pkg:oci/NAME@sha256:HEX[?repository_url=…&tag=…]`; the qualifiers sorted by key.
fn oci_purl(name: &str, repository: Option<&str>, tag: Option<&str>, digest: &str) -> String {
    let mut purl = format!(
        "pkg:oci/{}@{}",
        purl_encode(&name.to_ascii_lowercase(), false),
        purl_encode(digest, false)
    );
    let mut pairs = Vec::new();
    if let Some(repository) = repository {
        pairs.push(format!("repository_url={}", purl_encode(repository, true)));
    }
    if let Some(tag) = tag {
        pairs.push(format!("tag={}", purl_encode(tag, false)));
    }
    if !pairs.is_empty() {
        purl.push('?');
        purl.push_str(&pairs.join("&"));
    }
    purl
}

/// A base image as the build read it: a registry reference (`nvidia/cuda:12.8.1-…`,
/// `docker://nvcr.io/nvidia/pytorch:25.01-py3`) or a local transport (`oci:./base:latest`,
/// `docker-daemon:train:v1`), which names no registry.
#[derive(Debug, PartialEq)]
struct ImageName {
    /// The last path segment, lower case: the purl's name.
    name: String,
    /// `registry/repository` for a registry image, with Docker Hub's defaults filled in.
    repository: Option<String>,
    /// The tag, if named.
    tag: Option<String>,
}

impl ImageName {
    fn parse(text: &str) -> ImageName {
        let text = text.trim();
        for local in ["oci:", "docker-archive:", "oci-archive:"] {
            if let Some(rest) = text.strip_prefix(local) {
                // PATH[:TAG]; a colon followed by a slash belongs to the path.
                let (path, tag) = match rest.rsplit_once(':') {
                    Some((p, t)) if !t.contains('/') && !t.is_empty() => (p, Some(t)),
                    _ => (rest, None),
                };
                let stem = Path::new(path)
                    .file_stem()
                    .map(|s| s.to_string_lossy().to_ascii_lowercase())
                    .filter(|s| !s.is_empty() && s != "." && s != "..")
                    .unwrap_or_else(|| "base".into());
                return ImageName {
                    name: stem,
                    repository: None,
                    tag: tag.map(str::to_string),
                };
            }
        }
        // An image of the engine's own store: its name is the engine's, not a registry's.
        if let Some(rest) = text.strip_prefix("docker-daemon:") {
            let rest = rest.split('@').next().unwrap_or_default();
            let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
            let (repo, tag) = match rest[last_slash..].rfind(':') {
                Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
                None => (rest, None),
            };
            let name = repo
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            return ImageName {
                name: if name.is_empty() { "base".into() } else { name },
                repository: None,
                tag: tag.filter(|t| !t.is_empty()).map(str::to_string),
            };
        }
        let reference = text.strip_prefix("docker://").unwrap_or(text);
        // A digest in the reference is dropped: the document names the one really used.
        let reference = reference.split('@').next().unwrap_or_default();
        let last_slash = reference.rfind('/').map_or(0, |i| i + 1);
        let (repo, tag) = match reference[last_slash..].rfind(':') {
            Some(i) => (
                &reference[..last_slash + i],
                Some(&reference[last_slash + i + 1..]),
            ),
            None => (reference, None),
        };
        let first = repo.split('/').next().unwrap_or_default();
        let has_registry = repo.contains('/')
            && (first.contains('.') || first.contains(':') || first == "localhost");
        let repository = if has_registry {
            repo.to_string()
        } else if repo.contains('/') {
            format!("docker.io/{repo}")
        } else {
            format!("docker.io/library/{repo}")
        };
        let name = repo
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        ImageName {
            name: if name.is_empty() { "base".into() } else { name },
            repository: (!repo.is_empty()).then_some(repository.to_ascii_lowercase()),
            tag: tag.filter(|t| !t.is_empty()).map(str::to_string),
        }
    }

    fn purl(&self, digest: &str) -> String {
        oci_purl(
            &self.name,
            self.repository.as_deref(),
            self.tag.as_deref(),
            digest,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const BASE: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn lock() -> Lock {
        crate::resolve::resolve_recipe(
            &crate::recipe::LoadedRecipe::builtin_default(),
            &crate::resolve::Options::default(),
        )
        .unwrap()
        .lock
    }

    fn small_wheels() -> Vec<WheelRef> {
        let text = include_str!("../tests/fixtures/pylock.small.toml");
        crate::closure::parse(Path::new("pylock.small.toml"), text)
            .unwrap()
            .wheels
    }

    fn subject<'a>(lock: &'a Lock, wheels: &'a [WheelRef], image: &'a str) -> Subject<'a> {
        Subject {
            lock,
            wheels,
            base_digest: BASE,
            base_source: "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04",
            base_packages: None,
            image_digest: image,
            epoch: 1_700_000_000,
            created: 1_700_000_000,
        }
    }

    #[test]
    fn the_same_lock_and_base_give_the_same_bytes() {
        let lock = lock();
        let wheels = small_wheels();
        for format in [Format::Spdx, Format::Cyclonedx] {
            let one = subject(&lock, &wheels, IMAGE).render(format).unwrap();
            let two = subject(&lock, &wheels, IMAGE).render(format).unwrap();
            assert_eq!(one, two, "{format:?}");
            // The document's identity follows the image: another image, another identity.
            let other = "sha256:3333333333333333333333333333333333333333333333333333333333333333";
            let three = subject(&lock, &wheels, other).render(format).unwrap();
            assert_ne!(one, three, "{format:?}");
            let text = String::from_utf8(one).unwrap();
            assert!(text.contains("2023-11-14T22:13:20Z"), "dated by the epoch");
        }
        let spdx = subject(&lock, &wheels, IMAGE).spdx().unwrap();
        let cdx = subject(&lock, &wheels, IMAGE).cyclonedx().unwrap();
        let namespace = spdx["documentNamespace"].as_str().unwrap();
        let serial = cdx["serialNumber"].as_str().unwrap();
        assert!(namespace.starts_with("urn:uuid:"), "{namespace}");
        assert_ne!(namespace, serial, "each document has its own identity");
        assert_eq!(spdx["creationInfo"]["created"], "2023-11-14T22:13:20Z");
        assert_eq!(cdx["metadata"]["timestamp"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn every_wheel_is_listed_with_its_hash_url_and_purl() {
        let lock = lock();
        let wheels = small_wheels();
        assert_eq!(wheels.len(), 6);
        let spdx = subject(&lock, &wheels, IMAGE).spdx().unwrap();
        let cdx = subject(&lock, &wheels, IMAGE).cyclonedx().unwrap();
        let packages = spdx["packages"].as_array().unwrap();
        let relationships = spdx["relationships"].as_array().unwrap();
        let components = cdx["components"].as_array().unwrap();
        let depends_on = cdx["dependencies"][0]["dependsOn"].as_array().unwrap();
        for w in &wheels {
            let p = packages
                .iter()
                .find(|p| p["name"] == w.name.as_str())
                .unwrap_or_else(|| panic!("{} is not an SPDX package", w.name));
            assert_eq!(p["versionInfo"], w.version.as_str());
            assert_eq!(p["downloadLocation"], w.url.as_str());
            assert_eq!(p["checksums"][0]["algorithm"], "SHA256");
            assert_eq!(p["checksums"][0]["checksumValue"], w.sha256.as_str());
            assert_eq!(p["packageFileName"], w.file_name().as_str());
            let purl = p["externalRefs"][0]["referenceLocator"].as_str().unwrap();
            assert!(
                purl.starts_with(&format!("pkg:pypi/{}@{}?file_name=", w.name, w.version)),
                "{purl}"
            );
            assert!(
                relationships
                    .iter()
                    .any(|r| r["spdxElementId"] == "SPDXRef-Image"
                        && r["relationshipType"] == "CONTAINS"
                        && r["relatedSpdxElement"] == p["SPDXID"]),
                "the image CONTAINS {}",
                w.name
            );
            let c = components
                .iter()
                .find(|c| c["name"] == w.name.as_str())
                .unwrap_or_else(|| panic!("{} is not a CycloneDX component", w.name));
            assert_eq!(c["hashes"][0]["alg"], "SHA-256");
            assert_eq!(c["hashes"][0]["content"], w.sha256.as_str());
            assert_eq!(c["externalReferences"][0]["url"], w.url.as_str());
            assert_eq!(c["purl"].as_str().unwrap(), purl);
            assert!(
                depends_on.contains(&c["bom-ref"]),
                "the image depends on {}",
                w.name
            );
        }
        // The image and the base, then one package per wheel.
        assert_eq!(packages.len(), 2 + wheels.len());
        assert_eq!(components.len(), 1 + wheels.len());
    }

    #[test]
    fn a_lock_without_a_closure_lists_the_base_and_the_pins() {
        let lock = lock();
        let spdx = subject(&lock, &[], IMAGE).spdx().unwrap();
        let cdx = subject(&lock, &[], IMAGE).cyclonedx().unwrap();
        let packages = spdx["packages"].as_array().unwrap();
        assert_eq!(packages.len(), 2, "the image and its base");
        let base = &packages[1];
        assert_eq!(base["versionInfo"], BASE);
        assert_eq!(base["checksums"][0]["checksumValue"], &BASE[7..]);
        assert_eq!(
            base["externalRefs"][0]["referenceLocator"],
            format!(
                "pkg:oci/cuda@{BASE}?repository_url=docker.io/nvidia/cuda\
                 &tag=12.8.1-cudnn-runtime-ubuntu24.04"
            )
        );
        assert!(spdx["relationships"].as_array().unwrap().iter().any(|r| {
            r["relationshipType"] == "DESCENDANT_OF" && r["relatedSpdxElement"] == "SPDXRef-Base"
        }));
        let comments: Vec<&str> = packages[0]["annotations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["comment"].as_str().unwrap())
            .collect();
        let properties = cdx["metadata"]["component"]["properties"]
            .as_array()
            .unwrap();
        for (name, value) in [
            ("gpubake:pin:torch", lock.torch.version.to_string()),
            ("gpubake:pin:cuda", lock.cuda.version.to_string()),
            (
                "gpubake:pin:cudnn",
                lock.cudnn.version.as_ref().unwrap().to_string(),
            ),
            (
                "gpubake:pin:nccl",
                lock.nccl.version.as_ref().unwrap().to_string(),
            ),
            (
                "gpubake:pin:python",
                lock.python.version.as_ref().unwrap().to_string(),
            ),
            ("gpubake:pin:driver-min", lock.driver.min.to_string()),
            ("gpubake:python-stack", "none".to_string()),
        ] {
            assert!(
                comments.contains(&format!("{name}={value}").as_str()),
                "SPDX annotation {name}={value} in {comments:?}"
            );
            assert!(
                properties.contains(&json!({"name": name, "value": value})),
                "CycloneDX property {name}={value}"
            );
        }
        assert_eq!(cdx["components"].as_array().unwrap().len(), 1, "the base");
        assert_eq!(
            cdx["metadata"]["component"]["pedigree"]["ancestors"][0]["version"],
            BASE
        );
    }

    fn deb(name: &str, version: &str, url: &str) -> SystemPackage {
        SystemPackage {
            name: name.into(),
            version: version.into(),
            architecture: "amd64".into(),
            url: url.into(),
            size: 1234,
            sha256: "ab".repeat(32),
            // Where the archive's file names it: pool/main/SOURCE-INITIAL/SOURCE/.
            source: url
                .rsplit('/')
                .nth(1)
                .filter(|s| *s != name)
                .map(str::to_string),
        }
    }

    #[test]
    fn every_deb_of_the_system_layer_is_listed_with_its_hash_url_and_purl() {
        let mut lock = lock();
        lock.system = vec![
            deb(
                "numactl",
                "2.0.16-1",
                "http://deb.debian.org/debian/pool/main/n/numactl/numactl_2.0.16-1_amd64.deb",
            ),
            deb(
                "libc-bin",
                "1:2.36-9+deb12u4",
                "http://deb.debian.org/debian/pool/main/g/glibc/libc-bin_2.36-9+deb12u4_amd64.deb",
            ),
            deb(
                "rdma-core",
                "50.0-2build2",
                "http://archive.ubuntu.com/ubuntu/pool/main/r/rdma-core/rdma-core_50.0-2build2_amd64.deb",
            ),
            deb(
                "ubuntu-keyring",
                "2023.11.28.1",
                "http://deb.debian.org/debian/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb",
            ),
        ];
        let want = [
            "pkg:deb/debian/numactl@2.0.16-1?arch=amd64",
            "pkg:deb/debian/libc-bin@2.36-9%2Bdeb12u4?arch=amd64&epoch=1",
            "pkg:deb/ubuntu/rdma-core@50.0-2build2?arch=amd64",
            "pkg:deb/debian/ubuntu-keyring@2023.11.28.1?arch=amd64",
        ];
        let spdx = subject(&lock, &[], IMAGE).spdx().unwrap();
        let packages = spdx["packages"].as_array().unwrap();
        assert_eq!(packages.len(), 2 + 4, "the image, its base and four .debs");
        for (deb, purl) in lock.system.iter().zip(want) {
            let p = packages
                .iter()
                .find(|p| p["name"] == deb.name.as_str())
                .unwrap_or_else(|| panic!("{} in the SPDX packages", deb.name));
            assert_eq!(p["versionInfo"], deb.version.as_str());
            assert_eq!(p["downloadLocation"], deb.url.as_str());
            assert_eq!(p["checksums"][0]["checksumValue"], deb.sha256.as_str());
            assert_eq!(p["externalRefs"][0]["referenceLocator"], purl);
            let source = deb.source.as_deref().unwrap_or(&deb.name);
            assert_eq!(
                p["sourceInfo"],
                format!("built from the source package {source}")
            );
            assert!(spdx["relationships"].as_array().unwrap().iter().any(|r| {
                r["relationshipType"] == "CONTAINS" && r["relatedSpdxElement"] == p["SPDXID"]
            }));
        }
        let cdx = subject(&lock, &[], IMAGE).cyclonedx().unwrap();
        let components = cdx["components"].as_array().unwrap();
        assert_eq!(components.len(), 1 + 4, "the base and four .debs");
        let image_deps = &cdx["dependencies"][0]["dependsOn"];
        for (deb, purl) in lock.system.iter().zip(want) {
            let c = components
                .iter()
                .find(|c| c["purl"] == purl)
                .unwrap_or_else(|| panic!("{purl} in the CycloneDX components"));
            assert_eq!(c["version"], deb.version.as_str());
            assert_eq!(c["hashes"][0]["content"], deb.sha256.as_str());
            assert_eq!(c["externalReferences"][0]["url"], deb.url.as_str());
            let source = deb.source.as_deref().unwrap_or(&deb.name);
            assert!(
                c["properties"]
                    .as_array()
                    .unwrap()
                    .contains(&json!({"name": "gpubake:deb:source", "value": source}))
            );
            assert!(image_deps.as_array().unwrap().contains(&json!(purl)));
        }
    }

    /// A base's dpkg status: a package with a versioned Source, one without Source, one with
    /// an epoch, one the system layer reinstalls at its version, one it upgrades, and one
    /// removed but for its configuration files.
    const BASE_STATUS: &str = "Package: libc6\n\
        Status: install ok installed\n\
        Architecture: amd64\n\
        Multi-Arch: same\n\
        Source: glibc\n\
        Version: 2.36-9+deb12u4\n\
        \n\
        Package: dpkg\n\
        Essential: yes\n\
        Status: install ok installed\n\
        Architecture: amd64\n\
        Version: 1.21.22\n\
        \n\
        Package: libgcc-s1\n\
        Status: install ok installed\n\
        Architecture: amd64\n\
        Source: gcc-12 (12.2.0-14)\n\
        Version: 12.2.0-14\n\
        \n\
        Package: login\n\
        Status: install ok installed\n\
        Architecture: amd64\n\
        Source: shadow (1:4.13+dfsg1-1)\n\
        Version: 1:4.13+dfsg1-1+b1\n\
        \n\
        Package: numactl\n\
        Status: install ok installed\n\
        Architecture: amd64\n\
        Version: 2.0.16-1\n\
        \n\
        Package: openssh-client\n\
        Status: install ok installed\n\
        Architecture: amd64\n\
        Source: openssh\n\
        Version: 1:9.2p1-2\n\
        \n\
        Package: removed\n\
        Status: deinstall ok config-files\n\
        Architecture: amd64\n\
        Version: 1.0\n";

    /// Every `bom-ref` of the document, nested ones included.
    fn bom_refs(cdx: &Value) -> Vec<String> {
        fn walk(components: &Value, out: &mut Vec<String>) {
            for c in components.as_array().into_iter().flatten() {
                out.push(c["bom-ref"].as_str().unwrap().to_string());
                walk(&c["components"], out);
            }
        }
        let mut out = vec![
            cdx["metadata"]["component"]["bom-ref"]
                .as_str()
                .unwrap()
                .to_string(),
        ];
        walk(&cdx["components"], &mut out);
        out
    }

    /// A lock that reinstalls numactl at the base's version (one purl, listed once, as the
    /// layer's) and upgrades openssh-client (the image's version is the layer's, the base's
    /// stays the base's), over a base whose status lists both.
    fn base_fixture() -> (Lock, BasePackages) {
        let mut lock = lock();
        lock.system = vec![
            // Reinstalled at the base's version: one purl, listed once, as the layer's.
            deb(
                "numactl",
                "2.0.16-1",
                "http://deb.debian.org/debian/pool/main/n/numactl/numactl_2.0.16-1_amd64.deb",
            ),
            // Upgraded: the image's version is the layer's; the base's stays the base's.
            deb(
                "openssh-client",
                "1:9.2p1-2+deb12u3",
                "http://deb.debian.org/debian/pool/main/o/openssh/openssh-client_9.2p1-2+deb12u3_amd64.deb",
            ),
        ];
        let base = BasePackages::parse(
            BASE_STATUS,
            Some("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n"),
            "status",
        )
        .unwrap();
        (lock, base)
    }

    /// The base's packages the fixture lists under the base: name, purl, source package.
    const UNDER_BASE: [(&str, &str, &str); 5] = [
        (
            "libc6",
            "pkg:deb/debian/libc6@2.36-9%2Bdeb12u4?arch=amd64",
            "glibc",
        ),
        ("dpkg", "pkg:deb/debian/dpkg@1.21.22?arch=amd64", "dpkg"),
        (
            "libgcc-s1",
            "pkg:deb/debian/libgcc-s1@12.2.0-14?arch=amd64",
            "gcc-12",
        ),
        (
            "login",
            "pkg:deb/debian/login@4.13%2Bdfsg1-1%2Bb1?arch=amd64&epoch=1",
            "shadow",
        ),
        (
            "openssh-client",
            "pkg:deb/debian/openssh-client@9.2p1-2?arch=amd64&epoch=1",
            "openssh",
        ),
    ];

    #[test]
    fn the_base_s_status_gives_its_installed_packages_and_their_sources() {
        let (_, base) = base_fixture();
        assert_eq!(base.vendor, "debian");
        let names: Vec<&str> = base.packages.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "libc6",
                "dpkg",
                "libgcc-s1",
                "login",
                "numactl",
                "openssh-client"
            ],
            "installed packages only"
        );
        let sources: Vec<&str> = base.packages.iter().map(|p| p.source.as_str()).collect();
        assert_eq!(
            sources,
            ["glibc", "dpkg", "gcc-12", "shadow", "numactl", "openssh"]
        );
    }

    #[test]
    fn the_base_s_dpkg_packages_are_listed_under_the_base_once_each_in_spdx() {
        let (lock, base) = base_fixture();
        let mut s = subject(&lock, &[], IMAGE);
        s.base_packages = Some(&base);
        let under_base = UNDER_BASE;
        let spdx = s.spdx().unwrap();
        let packages = spdx["packages"].as_array().unwrap();
        let relationships = spdx["relationships"].as_array().unwrap();
        let purl_of = |p: &Value| {
            p["externalRefs"][0]["referenceLocator"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let contains = |from: &str, id: &Value| {
            relationships.iter().any(|r| {
                r["spdxElementId"] == from
                    && r["relationshipType"] == "CONTAINS"
                    && r["relatedSpdxElement"] == *id
            })
        };
        for (name, purl, source) in under_base {
            let p = packages
                .iter()
                .find(|p| purl_of(p) == purl)
                .unwrap_or_else(|| panic!("{purl} in the SPDX packages"));
            assert_eq!(p["name"], name);
            assert_eq!(
                p["downloadLocation"], "NOASSERTION",
                "dpkg's status names no URL"
            );
            assert!(p.get("checksums").is_none(), "nor a hash: {p}");
            assert_eq!(
                p["sourceInfo"],
                format!("built from the source package {source}")
            );
            assert!(
                contains("SPDXRef-Base", &p["SPDXID"]),
                "the base CONTAINS {name}"
            );
            assert!(
                !contains("SPDXRef-Image", &p["SPDXID"]),
                "the image does not, directly"
            );
        }
        // One purl, one package: the reinstalled numactl is the layer's, with its hash.
        let mut purls: Vec<String> = packages.iter().skip(2).map(purl_of).collect();
        let listed = purls.len();
        purls.sort();
        purls.dedup();
        assert_eq!(purls.len(), listed, "no purl twice");
        let numactl: Vec<&Value> = packages.iter().filter(|p| p["name"] == "numactl").collect();
        assert_eq!(numactl.len(), 1);
        assert_eq!(numactl[0]["checksums"][0]["checksumValue"], "ab".repeat(32));
        assert!(contains("SPDXRef-Image", &numactl[0]["SPDXID"]));
        let ssh: Vec<&Value> = packages
            .iter()
            .filter(|p| p["name"] == "openssh-client")
            .collect();
        assert_eq!(ssh.len(), 2, "the base's and the layer's upgrade");
        assert_eq!(
            packages.len(),
            2 + 2 + 5,
            "the image, its base, two .debs, five of the base's"
        );
    }

    #[test]
    fn the_base_s_dpkg_packages_are_nested_under_the_base_once_each_in_cyclonedx() {
        let (lock, base) = base_fixture();
        let mut s = subject(&lock, &[], IMAGE);
        s.base_packages = Some(&base);
        let under_base = UNDER_BASE;
        let cdx = s.cyclonedx().unwrap();
        let components = cdx["components"].as_array().unwrap();
        assert_eq!(
            components.len(),
            1 + 2,
            "the base and the two .debs at the top"
        );
        let nested = components[0]["components"].as_array().unwrap();
        assert_eq!(nested.len(), 5);
        for (name, purl, source) in under_base {
            let c = nested
                .iter()
                .find(|c| c["purl"] == purl)
                .unwrap_or_else(|| panic!("{purl} under the base component"));
            assert_eq!(c["name"], name);
            assert_eq!(c["type"], "library");
            assert!(c.get("hashes").is_none(), "{c}");
            let properties = c["properties"].as_array().unwrap();
            assert!(properties.contains(&json!({"name": "gpubake:layer", "value": "base"})));
            assert!(properties.contains(&json!({"name": "gpubake:deb:source", "value": source})));
        }
        let refs = bom_refs(&cdx);
        let mut unique = refs.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), refs.len(), "every bom-ref once: {refs:?}");
        // Every component, nested ones too, is in the graph; only the layer's are the
        // image's direct dependencies.
        let graph: Vec<&Value> = cdx["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| &d["ref"])
            .collect();
        for r in &refs {
            assert!(graph.contains(&&json!(r)), "{r} in the dependencies");
        }
        let image_deps = cdx["dependencies"][0]["dependsOn"].as_array().unwrap();
        assert!(!image_deps.contains(&json!(under_base[0].1)));

        // The same base and lock give the same bytes.
        for format in [Format::Spdx, Format::Cyclonedx] {
            assert_eq!(s.render(format).unwrap(), s.render(format).unwrap());
        }
    }

    #[test]
    fn the_vendor_of_the_base_s_packages_is_its_os_release_id() {
        let status = "Package: libc6\nStatus: install ok installed\nArchitecture: arm64\n\
                      Source: glibc\nVersion: 2.39-0ubuntu8.4\n";
        let ubuntu = BasePackages::parse(
            status,
            Some("NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\n"),
            "s",
        )
        .unwrap();
        assert_eq!(
            ubuntu.purl(&ubuntu.packages[0]),
            "pkg:deb/ubuntu/libc6@2.39-0ubuntu8.4?arch=arm64"
        );
        let unnamed = BasePackages::parse(status, None, "s").unwrap();
        assert_eq!(unnamed.vendor, "debian", "without os-release, Debian's");
        let e = BasePackages::parse(
            "Package: x\nStatus: install ok installed\n",
            None,
            "the base: /var/lib/dpkg/status",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the base: /var/lib/dpkg/status"), "{e}");
    }

    #[test]
    fn a_digest_that_is_no_sha256_is_an_error_not_a_document() {
        let lock = lock();
        let mut s = subject(&lock, &[], "sha256:abc");
        let err = s.render(Format::Spdx).unwrap_err().to_string();
        assert!(err.contains("`sha256:abc` is not a sha256 digest"), "{err}");
        s.image_digest = IMAGE;
        s.base_digest = "md5:00";
        assert!(s.render(Format::Cyclonedx).is_err());
    }

    #[test]
    fn base_references_become_oci_purls() {
        let cases = [
            (
                "ubuntu:24.04",
                "ubuntu",
                Some("docker.io/library/ubuntu"),
                Some("24.04"),
            ),
            (
                "nvcr.io/nvidia/pytorch:25.01-py3",
                "pytorch",
                Some("nvcr.io/nvidia/pytorch"),
                Some("25.01-py3"),
            ),
            (
                "localhost:5000/team/Base@sha256:00",
                "base",
                Some("localhost:5000/team/base"),
                None,
            ),
            ("docker-daemon:train:v1", "train", None, Some("v1")),
            (
                "docker://registry.example:5000/team/base:1",
                "base",
                Some("registry.example:5000/team/base"),
                Some("1"),
            ),
            (
                "oci:./images/bookworm:latest",
                "bookworm",
                None,
                Some("latest"),
            ),
            ("docker-archive:/tmp/base.tar", "base", None, None),
        ];
        for (text, name, repository, tag) in cases {
            let parsed = ImageName::parse(text);
            assert_eq!(
                parsed,
                ImageName {
                    name: name.into(),
                    repository: repository.map(str::to_string),
                    tag: tag.map(str::to_string),
                },
                "{text}"
            );
        }
        assert_eq!(
            ImageName::parse("oci:./b:v1").purl(BASE),
            format!("pkg:oci/b@{BASE}?tag=v1")
        );
    }

    #[test]
    fn pypi_purls_normalize_the_name_and_encode_the_local_version() {
        let wheel = WheelRef {
            name: "Nvidia_NCCL.cu12".into(),
            version: "2.9.1+cu128".into(),
            url: "https://download.pytorch.org/whl/cu128/torch-2.9.1%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl".into(),
            size: None,
            sha256: "0".repeat(64),
        };
        assert_eq!(
            pypi_purl(&wheel),
            "pkg:pypi/nvidia-nccl-cu12@2.9.1%2Bcu128?file_name=torch-2.9.1%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl"
        );
    }

    #[test]
    fn name_based_uuids_are_stable_version_8() {
        let a = name_uuid("spdx sha256:00");
        assert_eq!(a, name_uuid("spdx sha256:00"));
        assert_ne!(a, name_uuid("spdx sha256:01"));
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "8", "{a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }

    #[test]
    fn spdx_ids_stay_unique_and_clean() {
        let mut taken = HashSet::new();
        assert_eq!(unique_spdx_id(&mut taken, "a_b"), "SPDXRef-Wheel-a-b");
        assert_eq!(unique_spdx_id(&mut taken, "a-b"), "SPDXRef-Wheel-a-b-2");
    }
}
