//! What a build writes beside its image: the lock with its closures, the SBOM, the signed
//! provenance, and the image's signatures in its registry.

use super::request::{Request, SbomFormat};
use super::{BuildOptions, BuildReport};
use crate::closure::Closure;
use crate::error::{Error, Result};
use crate::image::{Platform, Transport};
use crate::resolve::Resolved;
use crate::sign::keys::PrivateKey;
use crate::wheel::cache::WheelRef;
use std::path::Path;

/// What the outputs need from before the build: when it started (the provenance's), and the
/// key that signs.
pub struct Started {
    time: String,
    key: Option<PrivateKey>,
}

/// Checks, before anything is built, that every output can be written, and reads the key:
/// an SBOM or lock path that could never be written, or a key that does not open, is refused
/// before the build, not after.
pub fn start(req: &Request) -> Result<Started> {
    for path in req
        .sbom
        .iter()
        .map(|(path, _)| path)
        .chain(&req.lock_out)
        .chain(&req.provenance)
    {
        crate::fsutil::output_target(path)?;
    }
    let time = crate::units::rfc3339_now();
    let key = match &req.key {
        Some((key, passphrase)) => crate::sign::signing_key(Some(key), passphrase.as_deref())?,
        None => None,
    };
    Ok(Started { time, key })
}

/// Writes what `req` asks for beside the built image: the lock, the SBOM, the signed
/// provenance, the image's signatures.
pub fn write(
    req: &Request,
    started: Started,
    (resolved, closures): (&Resolved, &[(Platform, Closure)]),
    opts: &BuildOptions,
    report: &BuildReport,
) -> Result<()> {
    if let Some(path) = &req.lock_out {
        crate::closure::write_lock(&resolved.lock, closures, path)?;
    }
    // The SBOM and the provenance list every wheel of every platform's closure, once.
    let wheels = crate::sbom::wheels_once(closures.iter().flat_map(|(_, c)| &c.wheels));
    if let Some((path, format)) = &req.sbom {
        write_sbom(path, *format, (resolved, &wheels), opts, report)?;
    }
    if let Some(key) = &started.key {
        let signed = (key, req.provenance.as_deref(), started.time);
        write_provenance(signed, (resolved, &wheels), opts, report)?;
        sign_image(key, &opts.to, report)?;
    }
    Ok(())
}
/// The base as the build read it: `--from` as given, else the recipe's own base.
fn base_source(resolved: &Resolved, opts: &BuildOptions) -> String {
    opts.from
        .as_ref()
        .map_or_else(|| resolved.lock.base.clone(), ToString::to_string)
}

/// What the SBOM and the provenance describe: the built image, its base and what went in.
fn subject<'a>(
    resolved: &'a Resolved,
    wheels: &'a [WheelRef],
    base_source: &'a str,
    opts: &BuildOptions,
    report: &'a BuildReport,
) -> crate::sbom::Subject<'a> {
    crate::sbom::Subject {
        lock: &resolved.lock,
        wheels,
        base_digest: report.base.as_str(),
        base_source,
        base_packages: report.base_packages.as_ref(),
        image_digest: report.manifest.as_str(),
        epoch: opts.epoch,
        created: crate::units::parse_rfc3339(&report.created).unwrap_or(opts.epoch),
    }
}

/// `--sbom FILE`: writes the image's SBOM there and, for a docker:// image, attaches it.
fn write_sbom(
    path: &Path,
    format: SbomFormat,
    (resolved, wheels): (&Resolved, &[WheelRef]),
    opts: &BuildOptions,
    report: &BuildReport,
) -> Result<()> {
    let base_source = base_source(resolved, opts);
    let subject = subject(resolved, wheels, &base_source, opts, report);
    let attached = crate::image::sbom::write(
        &subject.render(format)?,
        format.media_type(),
        path,
        &opts.to,
        &report.manifest,
        &report.created,
    )?;
    eprintln!("wrote the SBOM to {}", path.display());
    if let Some(artifact) = attached {
        eprintln!("attached the SBOM to {} as {artifact}", report.image);
    }
    Ok(())
}

/// `--key`: signs the build's provenance, writes it to `--provenance FILE` and, for a
/// docker:// image, attaches it there.
fn write_provenance(
    (key, path, started): (&PrivateKey, Option<&Path>, String),
    (resolved, wheels): (&Resolved, &[WheelRef]),
    opts: &BuildOptions,
    report: &BuildReport,
) -> Result<()> {
    use crate::sign::bundle::{self, Bundle};
    let base_source = base_source(resolved, opts);
    let subject = subject(resolved, wheels, &base_source, opts, report);
    let run = crate::bake::provenance::Run {
        started,
        finished: crate::units::rfc3339_now(),
    };
    let statement = crate::bake::provenance::statement(&opts.to.subject_name(), &subject, &run);
    let bytes = serde_json::to_vec(&Bundle::sign(&statement, key)).expect("bundles serialize");
    if let Some(path) = path {
        crate::fsutil::write_atomic(path, &bytes)?;
        eprintln!("wrote the signed provenance to {}", path.display());
    }
    if let Transport::Registry(remote) = &opts.to {
        let artifact = crate::image::referrers::attach(
            remote,
            &report.manifest,
            bundle::MEDIA_TYPE,
            &bytes,
            bundle::annotations(crate::bake::provenance::PREDICATE, &run.finished),
        )?;
        eprintln!(
            "attached the signed provenance to {} as {artifact}",
            report.image
        );
    }
    Ok(())
}

/// `--key` with a docker:// image: signs its manifest, and each platform's manifest of an
/// index (podman checks the one it pulls), as podman and skopeo verify at pull
/// (`sha256-<hex>.sig`).
fn sign_image(key: &PrivateKey, to: &Transport, report: &BuildReport) -> Result<()> {
    let Transport::Registry(remote) = to else {
        return Ok(());
    };
    let mut manifests = vec![report.manifest.clone()];
    if report.platforms.len() > 1 {
        for p in &report.platforms {
            manifests.push(p.manifest.parse().map_err(Error::Usage)?);
        }
    }
    let name = crate::image::signature::signed_name(&remote.parsed()?);
    for manifest in &manifests {
        let payload = crate::image::signature::payload(&name, manifest);
        let signature = key.sign(&payload);
        crate::image::signature::attach(remote, manifest, &payload, &signature)?;
        eprintln!(
            "signed {manifest} as {name} ({})",
            crate::image::signature::tag(manifest)
        );
    }
    Ok(())
}
